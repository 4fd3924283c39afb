"""The block ids a step sends: whole rows for new and resumed requests and for rows changed in
place, only the appended ids otherwise. `run_step` rebuilds every table from them alone and
checks it against the manager's rows at each step (`sched_helpers.follow_rows`)."""

from __future__ import annotations

from sched_helpers import make_config, req, run_step, tables

from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from pagesim.scheduler import Scheduler


def rewritten(out) -> list[str]:
    """Requests of a step sent whole although the runner holds their rows."""
    return [
        sr.request_id
        for sr in out.scheduled
        if sr.block_ids is not None and not (sr.first_scheduled or sr.resumed)
    ]


def test_a_decode_sends_only_its_new_block() -> None:
    s = Scheduler(make_config(block_size=4), KVCacheManager(16, 4, check_invariants=True))
    s.add_request(req("a", 4, max_tokens=6))
    out, _ = run_step(s)
    assert out.scheduled[0].block_ids == [1]
    sent = [run_step(s)[0].scheduled[0] for _ in range(5)]
    assert [sr.block_ids for sr in sent] == [None] * 5
    assert [sr.new_block_ids for sr in sent] == [[2], [], [], [], [3]]


def test_a_sliding_window_release_sends_the_row_whole() -> None:
    kv = KVCacheManager(32, 4, sliding_window=8, check_invariants=True)
    s = Scheduler(make_config(block_size=4), kv)
    for rid in ("a", "b"):
        s.add_request(req(rid, 10, max_tokens=20))
    whole = []
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        whole += rewritten(out)
        assert kv.rewritten_req_ids == set()  # the scheduler took them
    assert whole.count("a") >= 4 and whole.count("b") >= 4  # a block leaves per 4 decodes


def test_a_copy_on_write_sends_the_writer_s_row_whole() -> None:
    kv = KVCacheManager(16, 4, check_invariants=True)
    s = Scheduler(make_config(block_size=4), kv)
    parent = req("p", 6, max_tokens=4)
    s.add_request(parent)
    run_step(s)  # p: [1 (full), 2 (2 of 4 tokens)], then one sampled token
    child = req("c", list(parent.all_token_ids), max_tokens=1)
    child.num_computed_tokens = parent.num_computed_tokens
    kv.fork(parent, child)  # the child holds [1, 2] outside the scheduler
    out, _ = run_step(s)  # p writes into shared block 2: a private copy replaces it
    assert rewritten(out) == ["p"] and out.blocks_to_copy == [(2, 3)]
    assert tables(s)["p"] == [1, 3] and kv.get_block_ids("c") == [1, 2]
    assert rewritten(run_step(s)[0]) == []


def test_hybrid_groups_send_their_own_new_blocks_and_window_releases_whole() -> None:
    groups = (
        KVCacheGroupSpec(1, FullAttentionSpec(4)),
        KVCacheGroupSpec(1, SlidingWindowSpec(4, 8)),
    )
    kv = HybridKVCacheManager(KVCacheConfig(40, groups), check_invariants=True)
    s = Scheduler(make_config(block_size=4), kv)
    s.add_request(req("a", 10, max_tokens=12))
    out, _ = run_step(s)
    assert out.scheduled[0].block_ids == ([1, 2, 3], [4, 5, 6])
    whole, appended = [], []
    while s.has_unfinished_requests():
        out, _ = run_step(s)
        whole += rewritten(out)
        appended += [sr.new_block_ids for sr in out.scheduled if sr.block_ids is None]
    assert whole and ([7], [8]) in appended
