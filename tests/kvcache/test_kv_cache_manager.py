"""KVCacheManager: the scheduler's contract, failed allocations changing nothing, bad input,
the full-sequence admission gate, lookahead, copy-on-write forks, sliding windows, stats."""

from __future__ import annotations

import pytest
from kv_helpers import admit, decode, free_queue, make_manager, make_request, snapshot

from pagesim.errors import AllocationError, ConfigError, InternalError
from pagesim.kvcache.kv_cache_manager import KVCacheBlocks, KVCacheManager


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(num_gpu_blocks=1, block_size=16), "num_gpu_blocks=1"),
        (dict(num_gpu_blocks=10, block_size=0), "block_size=0"),
        (dict(num_gpu_blocks=10, block_size=16, vllm_compat="0.99"), "vllm_compat='0.99'"),
        (dict(num_gpu_blocks=10, block_size=16, sliding_window=0), "sliding_window=0"),
        (dict(num_gpu_blocks=10, block_size=16, max_model_len=0), "max_model_len=0"),
    ],
)
def test_bad_configuration(kw, field):
    with pytest.raises(ConfigError, match=field) as err:
        KVCacheManager(**kw)
    assert "\n" not in str(err.value)


def test_scheduler_contract_and_live_block_id_rows():
    mgr = make_manager(10, block_size=4)
    req = make_request("r0", list(range(10)), max_tokens=8)
    computed_blocks, num_computed = mgr.get_computed_blocks(req)
    assert (computed_blocks.get_block_ids(), num_computed) == ([], 0)
    new = mgr.allocate_slots(
        req, 10, num_new_computed_tokens=num_computed, new_computed_blocks=computed_blocks
    )
    assert isinstance(new, KVCacheBlocks) and new.get_block_ids() == [1, 2, 3]
    req.num_computed_tokens = 10
    row = mgr.get_block_ids("r0")
    assert row == [1, 2, 3] and mgr.get_block_ids("r0") is row  # the live list, no copy
    assert mgr.usage == pytest.approx(3 / 9)
    assert (mgr.num_free_blocks, mgr.num_usable_blocks) == (6, 9)
    assert [decode(mgr, req) for _ in range(3)] == [[], [], [4]]  # 11, 12, 13 tokens
    assert row == [1, 2, 3, 4]
    assert mgr.get_blocks("r0").get_block_ids() == [1, 2, 3, 4]
    mgr.free(req)
    assert mgr.get_block_ids("r0") == [] and mgr.usage == 0.0
    assert free_queue(mgr) == [4, 5, 6, 7, 8, 9, 3, 2, 1]


def test_failed_allocation_changes_nothing():
    mgr = make_manager(8, block_size=4)
    a = make_request("a", list(range(12)))
    admit(mgr, a)  # [1, 2, 3], all cached
    mgr.free(a)
    admit(mgr, make_request("b", list(range(50, 62))))  # takes 4, 5, 6
    before = snapshot(mgr)
    c = make_request("c", list(range(12)) + list(range(80, 90)))  # hits 3 blocks, needs 3 more
    hit, new, num_hit = admit(mgr, c)
    assert (hit, new, num_hit) == ([1, 2, 3], None, 12)
    assert snapshot(mgr) == before
    assert c.num_computed_tokens == 0 and "c" not in mgr.req_to_blocks


@pytest.mark.parametrize("n", [-1, 0])
def test_non_positive_num_new_tokens(n):
    mgr = make_manager(8, block_size=4)
    with pytest.raises(InternalError, match=f"num_new_tokens={n}: must be >= 1"):
        mgr.allocate_slots(make_request("r", [1, 2, 3]), n)


def test_request_larger_than_the_cache_is_an_error_not_a_none():
    mgr = make_manager(8, block_size=4)  # 7 usable blocks = 28 slots
    req = make_request("big", list(range(29)))
    before = snapshot(mgr)
    with pytest.raises(
        AllocationError,
        match="num_new_tokens=29: .* would hold 8 blocks, the cache has 7 usable blocks",
    ):
        mgr.allocate_slots(req, 29)
    assert snapshot(mgr) == before
    assert mgr.can_fit(28) and not mgr.can_fit(29)
    with pytest.raises(AllocationError, match="num_new_tokens=8"):  # the gate says so too
        mgr.allocate_slots(req, 8, full_sequence_must_fit=True)
    assert mgr.allocate_slots(make_request("ok", list(range(28))), 28) is not None


def test_hit_arguments_must_agree():
    mgr = make_manager(8, block_size=4)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    b = make_request("b", list(range(9)))
    hit, n = mgr.get_computed_blocks(b)
    with pytest.raises(InternalError, match="num_new_computed_tokens=4"):
        mgr.allocate_slots(b, 5, num_new_computed_tokens=4, new_computed_blocks=hit)
    with pytest.raises(InternalError, match="is running"):
        mgr.allocate_slots(a, 1, num_new_computed_tokens=n, new_computed_blocks=hit)


def test_full_sequence_gate_blocks_partial_admission():
    mgr = make_manager(6, block_size=4)  # 5 usable blocks
    admit(mgr, make_request("a", list(range(100, 108))))  # holds 2
    req = make_request("long", list(range(16)))  # needs 4 blocks, 3 are free
    assert mgr.allocate_slots(req, 4, full_sequence_must_fit=True) is None
    assert "long" not in mgr.req_to_blocks
    new = mgr.allocate_slots(req, 4)  # without the gate the first chunk fits
    assert new.get_block_ids() == [3]


def test_full_sequence_gate_counts_prefix_hits():
    mgr = make_manager(6, block_size=4)
    a = make_request("a", list(range(12)) + [99])
    admit(mgr, a)  # [1, 2, 3, 4]
    b = make_request("b", list(range(12)) + [98, 97, 96, 95, 94])  # hit 3 blocks, 17 tokens
    hit, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 12
    assert mgr.get_num_blocks_to_allocate(b, b.num_tokens, hit, num_hit) == 2
    assert mgr.allocate_slots(b, 2, num_hit, hit, full_sequence_must_fit=True) is None
    mgr.free(a)  # now 1, 2, 3 are free cached blocks: touching them consumes free blocks
    hit, num_hit = mgr.get_computed_blocks(b)
    assert mgr.get_num_blocks_to_allocate(b, b.num_tokens, hit, num_hit) == 5
    assert mgr.allocate_slots(b, 2, num_hit, hit, full_sequence_must_fit=True) is not None


def test_lookahead_slots_are_allocated_but_not_cached():
    mgr = make_manager(10, block_size=4)
    req = make_request("a", list(range(8)))
    new = mgr.allocate_slots(req, 8, num_lookahead_tokens=5)
    assert new.get_block_ids() == [1, 2, 3, 4]
    assert mgr.num_cached_block["a"] == 2
    assert [mgr.block_pool.blocks[i].block_hash is not None for i in (1, 2, 3, 4)] == [
        True,
        True,
        False,
        False,
    ]


def test_max_model_len_caps_slots():
    mgr = make_manager(10, block_size=4, max_model_len=10)
    req = make_request("a", list(range(8)))
    assert mgr.allocate_slots(req, 8, num_lookahead_tokens=8).get_block_ids() == [1, 2, 3]


def test_fork_shares_blocks_and_copies_a_partial_block_on_write():
    mgr = make_manager(10, block_size=4)
    parent = make_request("p", list(range(6)))
    admit(mgr, parent)  # [1 (full, cached), 2 (2 tokens)]
    child = make_request("c", list(range(6)))
    child.num_computed_tokens = parent.num_computed_tokens
    mgr.fork(parent, child)
    assert mgr.get_block_ids("c") == [1, 2]
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 2)] == [2, 2]
    assert decode(mgr, parent, 60) == []  # writes position 6 into shared block 2: copy first
    assert mgr.get_block_ids("p") == [1, 3] and mgr.get_block_ids("c") == [1, 2]
    assert mgr.take_blocks_to_copy() == [(2, 3)]
    assert mgr.take_blocks_to_copy() == []
    assert decode(mgr, child, 61) == []  # block 2 is the child's alone now: no copy
    assert mgr.take_blocks_to_copy() == []
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 1, 1]
    assert decode(mgr, parent, 62) == [] and decode(mgr, parent, 63) == [4]
    assert mgr.num_cached_block["p"] == 2
    mgr.free(parent)
    mgr.free(child)
    assert mgr.num_free_blocks == 9


def test_fork_at_a_block_boundary_copies_nothing():
    mgr = make_manager(10, block_size=4)
    parent = make_request("p", list(range(8)))
    admit(mgr, parent)
    child = make_request("c", list(range(8)))
    child.num_computed_tokens = 8
    mgr.fork(parent, child)
    assert decode(mgr, child) == [3] and decode(mgr, parent) == [4]
    assert mgr.take_blocks_to_copy() == []
    assert mgr.get_block_ids("c") == [1, 2, 3] and mgr.get_block_ids("p") == [1, 2, 4]


def test_failed_copy_on_write_changes_nothing():
    mgr = make_manager(4, block_size=4)
    parent = make_request("p", list(range(6)))
    admit(mgr, parent)  # [1, 2]
    admit(mgr, make_request("x", [9, 9]))  # [3]: nothing left
    child = make_request("c", list(range(6)))
    child.num_computed_tokens = 6
    mgr.fork(parent, child)
    before = snapshot(mgr)
    assert decode(mgr, parent) is None
    assert snapshot(mgr) == before


def test_fork_errors():
    mgr = make_manager(10, block_size=4)
    a, b = make_request("a", [1, 2]), make_request("b", [1, 2])
    with pytest.raises(InternalError, match="parent='a'"):
        mgr.fork(a, b)
    admit(mgr, a)
    admit(mgr, b)
    with pytest.raises(InternalError, match="child='b'"):
        mgr.fork(a, b)


def test_sliding_window_frees_blocks_out_of_the_window():
    mgr = make_manager(10, block_size=4, sliding_window=8)
    req = make_request("a", list(range(20)))
    assert admit(mgr, req) == ([], [1, 2, 3, 4, 5], 0)
    # Next query at position 20 sees 13..20: blocks 0-2 (tokens 0..11) are dead.
    assert decode(mgr, req) == [6]
    assert mgr.get_block_ids("a") == [0, 0, 0, 4, 5, 6]
    assert free_queue(mgr) == [7, 8, 9, 3, 2, 1]  # cached, so to the tail, latest first
    live_max = 0
    for _ in range(60):
        decode(mgr, req)
        live_max = max(live_max, sum(1 for i in mgr.get_block_ids("a") if i))
    assert live_max == mgr._window.peak_decode_blocks == 3
    assert mgr.usage <= 3 / 9
    mgr.free(req)
    assert mgr.num_free_blocks == 9


def test_sliding_window_prefix_hit_needs_only_the_window():
    mgr = make_manager(12, block_size=4, sliding_window=8)
    a = make_request("a", list(range(20)))
    admit(mgr, a)  # [1..5]
    b = make_request("b", list(range(20)) + [77])
    # The next query (position 20) sees tokens 13..20: blocks 3 and 4 suffice; 0..2 are null.
    assert admit(mgr, b) == ([0, 0, 0, 4, 5], [6], 20)
    assert mgr.get_block_ids("b") == [0, 0, 0, 4, 5, 6]
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 4, 5)] == [1, 2, 2]


def test_sliding_window_prefix_hit_searches_from_the_right():
    mgr = make_manager(7, block_size=4, sliding_window=8)
    a = make_request("a", list(range(20)))
    admit(mgr, a)  # [1..5]
    mgr.free(a)
    assert free_queue(mgr) == [6, 5, 4, 3, 2, 1]
    admit(mgr, make_request("x", list(range(50, 58))))  # takes 6 and 5: a's last block evicted
    c = make_request("c", list(range(20)) + [77])
    # Block 4 (tokens 16..19) is gone; blocks 2 and 3 are two contiguous cached blocks.
    assert admit(mgr, c) == ([0, 0, 3, 4], [2, 1], 16)
    assert mgr.get_block_ids("c") == [0, 0, 3, 4, 2, 1]


def test_sliding_window_releases_dead_blocks_even_when_allocation_fails():
    mgr = make_manager(7, block_size=4, sliding_window=8)
    a = make_request("a", list(range(16)))
    admit(mgr, a)  # [1, 2, 3, 4]
    admit(mgr, make_request("x", list(range(50, 58))))  # [5, 6]: none left
    a.output_token_ids.append(1)
    assert mgr.allocate_slots(a, 1, num_lookahead_tokens=8) is None  # needs 3 more blocks
    # As in vLLM, blocks the next query cannot see were released before the check.
    assert mgr.get_block_ids("a") == [0, 0, 3, 4] and free_queue(mgr) == [2, 1]


def test_sliding_window_admission_cap():
    tokens = list(range(40))  # 10 blocks; only 6 usable
    uncapped = make_manager(7, block_size=4, sliding_window=8)
    with pytest.raises(AllocationError, match="would hold 10 blocks"):
        uncapped.allocate_slots(make_request("a", tokens), 8, full_sequence_must_fit=True)
    capped = make_manager(7, block_size=4, sliding_window=8, max_num_batched_tokens=8)
    assert capped._window.admission_cap_blocks == 5  # cdiv(7 + 8, 4) + 1
    req = make_request("a", tokens)
    for chunk in range(5):  # chunked prefill, 8 tokens a step, gated every time
        assert capped.allocate_slots(req, 8, full_sequence_must_fit=True) is not None
        req.num_computed_tokens += 8
        assert sum(1 for i in capped.get_block_ids("a") if i) <= 5, chunk
    assert req.num_computed_tokens == 40


def test_prefix_cache_stats_count_admissions_only():
    mgr = make_manager(8, block_size=4)
    a = make_request("a", list(range(9)))
    admit(mgr, a)
    b = make_request("b", list(range(9)) + list(range(50, 66)))  # 7 blocks, 5 new
    assert admit(mgr, b)[1] is None  # not admitted: not counted
    s = mgr.prefix_cache_stats
    assert (s.requests, s.queries, s.hits) == (1, 9, 0)
    c = make_request("c", list(range(9)))
    admit(mgr, c)
    assert (s.requests, s.queries, s.hits) == (2, 18, 8)
    assert s.hit_rate == pytest.approx(8 / 18)
    mgr.free(c)
    c.num_preemptions, c.num_computed_tokens = 1, 0
    admit(mgr, c)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)
    interval = mgr.make_prefix_cache_stats()
    assert (interval.requests, interval.queries, interval.preempted_requests) == (2, 18, 1)
    assert mgr.make_prefix_cache_stats().queries == 0
    assert mgr.reset_prefix_cache() is False  # blocks in use
    mgr.free(a)
    mgr.free(c)
    assert mgr.reset_prefix_cache() is True and s.reset
    assert admit(mgr, make_request("d", list(range(9))))[2] == 0


def test_can_fit_with_a_sliding_window_uses_the_peak_not_the_length():
    decode_only = make_manager(5, block_size=4, sliding_window=8)  # 4 usable blocks
    assert decode_only._window.peak_decode_blocks == 3
    assert decode_only.can_fit(10_000)
    chunked = make_manager(5, block_size=4, sliding_window=8, max_num_batched_tokens=8)
    assert chunked._window.peak_blocks == 5  # an 8-token chunk on top of a full window
    assert not chunked.can_fit(10_000) and chunked.can_fit(16)
