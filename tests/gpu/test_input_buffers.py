"""Persistent step inputs (`pagesim.gpu.input_buffers`) against the core's own functions.

`BlockTableRows` keeps rows across steps and rewrites only what changed; whatever the requests'
rows do between steps (append, change in place as copy-on-write and sliding windows do, shrink
and regrow after a preemption, finish), the gathered table must equal `build_block_table` of
the step's rows, both gathered whole and by `GatheredTable` (columns in use only, into one
buffer reused across steps of any size, padding rows null). The vectorized slot and position builders must equal `build_slot_mapping`
and `build_positions`. `StagedBuffers` must copy exactly the prefix asked for.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagesim.errors import InternalError
from pagesim.gpu.input_buffers import (
    ALIGN,
    BlockTableRows,
    GatheredTable,
    StagedBuffers,
    decode_slots,
    token_slots,
)
from pagesim.kvcache.block_table import (
    NULL_BLOCK_ID,
    build_block_table,
    build_positions,
    build_slot_mapping,
)
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput

WIDTH = 16
MAX_STEP = 8  # rows of the staged table in the state machine
NULL = NULL_BLOCK_ID
IDS = st.integers(min_value=0, max_value=1000)


class RowsMachine(RuleBasedStateMachine):
    """Random request rows against a plain dict of lists; two initial rows, so growth runs."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = BlockTableRows(WIDTH, num_rows=2)
        self.model: dict[str, list[int]] = {}
        self.next_id = 0
        # the staged table, null as a reset leaves it, reused by every step
        self.gathered = GatheredTable(np.full((MAX_STEP, WIDTH), NULL, dtype=np.int32))

    @rule(ids=st.lists(IDS, min_size=1, max_size=WIDTH))
    def add(self, ids: list[int]) -> None:
        self.model[f"r{self.next_id}"] = ids
        self.next_id += 1

    @precondition(lambda self: self.model)
    @rule(data=st.data(), more=st.lists(IDS, min_size=1, max_size=4))
    def append(self, data, more: list[int]) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model)))
        self.model[rid] = (self.model[rid] + more)[:WIDTH]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), value=IDS)
    def change_in_place(self, data, value: int) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model)))
        row = list(self.model[rid])
        row[data.draw(st.integers(0, len(row) - 1))] = value
        self.model[rid] = row

    @precondition(lambda self: self.model)
    @rule(data=st.data(), ids=st.lists(IDS, min_size=1, max_size=WIDTH))
    def replace(self, data, ids: list[int]) -> None:  # preempted and resumed: a new row
        self.model[data.draw(st.sampled_from(sorted(self.model)))] = ids

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def finish(self, data) -> None:
        rid = data.draw(st.sampled_from(sorted(self.model)))
        del self.model[rid]
        self.rows.free([rid, "never-seen"])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def step(self, data) -> None:
        rids = data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, unique=True))
        idx = [self.rows.row_index(rid, self.model[rid]) for rid in rids]
        assert len(set(idx)) == len(idx)  # live requests never share a row
        got = self.rows.table[idx].tolist()
        want = build_block_table([self.model[r] for r in rids], WIDTH)
        assert got == want
        size = data.draw(st.integers(len(rids), max(len(rids), MAX_STEP)))
        if size <= MAX_STEP:
            self.gathered.gather(self.rows, idx, size)
            assert self.gathered.out[:size].tolist() == want + [[NULL] * WIDTH] * (size - len(rids))

    @invariant()
    def rows_are_accounted(self) -> None:
        assert set(self.rows._rows) <= set(self.model)  # finished requests hold no row
        assert self.rows.num_live + len(self.rows._free) == self.rows.table.shape[0]
        for row, written in self.rows._rows.values():
            assert self.rows.lengths[row] == len(written)
        beyond = np.arange(WIDTH)[None, :] >= self.rows.lengths[:, None]
        assert (self.rows.table[beyond] == NULL).all()  # past a row's blocks: null


TestRows = RowsMachine.TestCase
TestRows.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_a_row_longer_than_the_table_is_refused() -> None:
    rows = BlockTableRows(4)
    with pytest.raises(ValueError, match="5 blocks > table width 4"):
        rows.row_index("r", [1, 2, 3, 4, 5])
    rows.row_index("r", [1, 2, 3, 4])
    with pytest.raises(ValueError, match="5 blocks > table width 4"):
        rows.row_index("r", [1, 2, 3, 4, 5])


def test_an_unchanged_row_is_not_rewritten() -> None:
    rows = BlockTableRows(8)
    r = rows.row_index("a", [3, 4])
    assert rows.block_ids("a") == [3, 4]
    rows.table[r, 5] = 99  # a byte a rewrite would reset to the null block
    assert rows.row_index("a", [3, 4]) == r and rows.table[r, 5] == 99
    rows.row_index("a", [3, 4, 7])  # resent longer: its blocks written, nothing past them
    assert rows.table[r, :3].tolist() == [3, 4, 7] and rows.table[r, 5] == 99
    rows.row_index("a", [3, 8, 7])  # changed in place: the row's blocks rewritten
    assert rows.table[r, :3].tolist() == [3, 8, 7] and rows.table[r, 5] == 99
    rows.row_index("a", [3])  # shrunk: the entries it gave up reset, nothing past them
    assert rows.table[r, :3].tolist() == [3, 0, 0] and rows.table[r, 5] == 99
    rows.free(["a"])
    assert rows.num_live == 0


def test_a_step_s_deltas_append_to_the_rows_it_holds() -> None:
    rows = BlockTableRows(8, num_rows=1)
    a, b = Request("a", [1] * 8, 4), Request("b", [2] * 8, 4)
    first = SchedulerOutput(0, [ScheduledRequest(a, 8, 0, [3, 4]), ScheduledRequest(b, 8, 0, [5])])
    assert rows.update(first) == [0, 1]  # the table grew to hold b
    rows.table[0, 5] = 99  # a byte no append may touch
    nxt = SchedulerOutput(
        1, [ScheduledRequest(a, 1, 8, None, [7]), ScheduledRequest(b, 1, 8, None)]
    )
    assert rows.update(nxt) == [0, 1]
    assert rows.table[:2, :3].tolist() == [[3, 4, 7], [5, 0, 0]] and rows.table[0, 5] == 99
    assert rows.block_ids("a") == [3, 4, 7] and rows.lengths[:2].tolist() == [3, 1]
    done = SchedulerOutput(2, [ScheduledRequest(b, 1, 9, None)], finished_req_ids=["a"])
    assert rows.update(done) == [1] and rows.num_live == 1
    with pytest.raises(InternalError, match="'a': new block ids for no row"):
        rows.update(SchedulerOutput(3, [ScheduledRequest(a, 1, 9, None, [8])]))


@settings(max_examples=80, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 9)), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_vectorized_slots_and_positions_equal_the_core_functions(seqs, block_size) -> None:
    starts = [s for s, _ in seqs]
    news = [n for _, n in seqs]
    rows = [
        list(range(10 * i + 1, 10 * i + 1 + -(-(s + n) // block_size)))
        for i, (s, n) in enumerate(seqs)
    ]
    width = max(len(r) for r in rows)
    table = np.asarray(build_block_table(rows, width), dtype=np.int32)
    positions, slots = token_slots(table, np.asarray(starts), np.asarray(news), block_size)
    assert positions.tolist() == build_positions(starts, news)
    assert slots.tolist() == build_slot_mapping(rows, starts, news, block_size)
    pos = np.asarray([s + n - 1 for s, n in seqs])
    assert decode_slots(table, pos, block_size).tolist() == build_slot_mapping(
        rows, pos.tolist(), [1] * len(seqs), block_size
    )


def test_staged_buffers_lay_fields_out_aligned_and_copy_only_the_prefix() -> None:
    buf = StagedBuffers(
        [("a", torch.int64, (3, 5)), ("b", torch.int32, (7,)), ("t", torch.int32, (4, 6))],
        torch.device("cpu"),
    )
    assert all(buf.offset(n) % ALIGN == 0 for n in ("a", "b", "t"))
    buf.host["a"][...] = np.arange(15).reshape(3, 5)
    buf.host["b"][...] = 7
    buf.host["t"][...] = np.arange(24).reshape(4, 6)
    buf.copy_to_device(buf.offset("t") + 2 * 6 * 4)  # two rows of six int32
    assert buf.device["a"].tolist() == np.arange(15).reshape(3, 5).tolist()
    assert buf.device["b"].eq(7).all()
    assert buf.device["t"][:2].tolist() == np.arange(12).reshape(2, 6).tolist()
    assert buf.device["t"][2:].eq(0).all()  # rows past the prefix were not copied
    buf.copy_to_device()
    assert buf.device["t"].tolist() == np.arange(24).reshape(4, 6).tolist()


def test_the_gathered_table_writes_only_the_columns_in_use() -> None:
    """A wide table (a long max_model_len) with short rows: the gather leaves the columns no
    row of the buffer ever used untouched, and null past each row's blocks; rows past a
    step's size keep what they hold until a step covers them again."""
    rows = BlockTableRows(1024)
    out = np.zeros((4, 1024), dtype=np.int32)
    gathered = GatheredTable(out)
    out[:, 600] = 77  # a column no step uses: never read, never written
    a, b, c = (
        rows.row_index("a", [1, 2, 3]),
        rows.row_index("b", [4]),
        rows.row_index("c", [6, 7]),
    )
    gathered.gather(rows, [a, b, c], 4)
    assert out[:, :4].tolist() == [[1, 2, 3, 0], [4, 0, 0, 0], [6, 7, 0, 0], [0, 0, 0, 0]]
    assert (out[:, 600] == 77).all()
    rows.free(["a"])
    gathered.gather(rows, [rows.row_index("b", [4, 5])], 1)  # shorter rows: stale reset
    assert out[0, :4].tolist() == [4, 5, 0, 0]
    assert out[2, :2].tolist() == [6, 7]  # past the step's size: not part of its table
    gathered.gather(rows, [rows.row_index("b", [4, 5])], 3)
    assert out[:3, :4].tolist() == [[4, 5, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert (out[:, 600] == 77).all()
