"""Block tables and slot mappings against a hand-computed picture, padding, and rows taken
from the KV cache manager.

block_size = 4; three sequences this step:

    seq A  table [3, 7]     writes positions 5, 6  -> block 7, offsets 1, 2 -> slots 29, 30
    seq B  table [5]        writes positions 0..2  -> block 5, offsets 0..2 -> slots 20, 21, 22
    seq C  table [2, 9, 4]  writes position 8      -> block 4, offset 0     -> slot 16
"""

from __future__ import annotations

import pytest
from kv_helpers import admit, decode, make_manager, make_request

from pagesim.kvcache.block_table import (
    NULL_BLOCK_ID,
    PAD_SLOT_ID,
    build_block_table,
    build_positions,
    build_query_start_loc,
    build_slot_mapping,
)

ROWS = [[3, 7], [5], [2, 9, 4]]
STARTS = [5, 0, 8]
NEW = [2, 3, 1]


def test_slot_mapping_matches_the_picture():
    assert build_slot_mapping(ROWS, STARTS, NEW, block_size=4) == [29, 30, 20, 21, 22, 16]
    assert build_slot_mapping(ROWS, STARTS, NEW, 4, pad_to=8) == [
        29,
        30,
        20,
        21,
        22,
        16,
        PAD_SLOT_ID,
        PAD_SLOT_ID,
    ]
    assert PAD_SLOT_ID < 0


def test_positions_and_query_start_loc():
    assert build_positions(STARTS, NEW) == [5, 6, 0, 1, 2, 8]
    assert build_query_start_loc(NEW) == [0, 2, 5, 6]
    assert build_query_start_loc([]) == [0]


def test_block_table_padding_with_the_null_block():
    assert NULL_BLOCK_ID == 0
    assert build_block_table(ROWS) == [[3, 7, 0], [5, 0, 0], [2, 9, 4]]
    assert build_block_table(ROWS, max_num_blocks_per_seq=4) == [
        [3, 7, 0, 0],
        [5, 0, 0, 0],
        [2, 9, 4, 0],
    ]
    assert build_block_table([]) == []
    with pytest.raises(ValueError, match="max_num_blocks_per_seq=2"):
        build_block_table(ROWS, max_num_blocks_per_seq=2)


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="differ in length"):
        build_slot_mapping(ROWS, [0, 0], NEW, 4)
    with pytest.raises(ValueError, match="position 8 needs block 2"):
        build_slot_mapping([[1, 2]], [7], [2], 4)
    with pytest.raises(ValueError, match="pad_to=5"):
        build_slot_mapping(ROWS, STARTS, NEW, 4, pad_to=5)
    assert build_slot_mapping([[]], [0], [0], 4) == []  # nothing written, no block needed


def test_rows_from_the_manager_write_only_new_tokens_into_private_blocks():
    mgr = make_manager(16, block_size=4)
    a = make_request("a", list(range(10)))
    admit(mgr, a)  # [1, 2, 3]
    b = make_request("b", list(range(8)) + [50, 51, 52])
    hit, new, num_hit = admit(mgr, b)
    assert (hit, new, num_hit) == ([1, 2], [4], 8)
    rows = [mgr.get_block_ids("b")]
    # b computes positions 8..10 only: they land in its own block 4, never in the shared 1, 2.
    assert build_slot_mapping(rows, [8], [3], 4) == [16, 17, 18]


def test_sliding_window_rows_hold_null_entries_that_are_never_written():
    mgr = make_manager(16, block_size=4, sliding_window=6)
    req = make_request("a", list(range(12)))
    admit(mgr, req)
    decode(mgr, req)
    row = mgr.get_block_ids("a")
    # The query at position 12 sees 7..12: block 0 (tokens 0..3) is dead and nulled.
    assert row == [0, 2, 3, 4]
    slots = build_slot_mapping([row], [12], [1], 4)  # the token at position 12
    assert slots == [row[3] * 4 + 0]
    assert build_block_table([row], max_num_blocks_per_seq=6)[0] == [0, 2, 3, 4, 0, 0]
