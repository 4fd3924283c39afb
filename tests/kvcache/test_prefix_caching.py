"""Prefix caching, exact state after each operation, in the style of vLLM's
tests/v1/core/test_prefix_caching.py. The first test replays the scenario of
shared/vllm_parity.md section 5, whose block ids and queues were recorded from vLLM 0.23.0 and
0.33.0 themselves."""

from __future__ import annotations

import pytest
from kv_helpers import admit, decode, free_queue, make_manager, make_request

from pagesim.kvcache.block_pool import BlockRemoved, BlockStored

A = list(range(100, 150))  # 50 tokens: 3 full blocks of 16 + 2 tokens

# step -> (0.23 result, 0.33 result) where they differ; vLLM's own output.
PARITY = {
    "free r2": ([4, 5, 3], [5, 4, 3]),
    "free r3": ([4, 5, 3, 6, 2, 1], [5, 4, 3, 6, 2, 1]),
    "free r4": ([4, 5, 3, 6, 2, 1, 10], [10, 5, 4, 3, 6, 2, 1]),
    "free r4b": ([4, 5, 3, 6, 2, 1, 10, 11, 9, 8, 7], [11, 10, 5, 4, 3, 6, 2, 1, 9, 8, 7]),
    "r5": ([4, 5, 3, 6, 2, 1], [11, 10, 5, 4, 3, 6]),
    "r6": ((0, [], [10, 11, 9, 8]), (32, [1, 2], [9, 8])),
}


@pytest.mark.parametrize("compat", ["0.23", "0.33"])
def test_vllm_parity_scenario(compat):
    pick = 0 if compat == "0.23" else 1
    mgr = make_manager(12, vllm_compat=compat)
    assert free_queue(mgr) == list(range(1, 12))
    r1 = make_request("r1", A)
    assert admit(mgr, r1) == ([], [1, 2, 3, 4], 0)
    r2 = make_request("r2", A[:48] + [1, 2, 3])
    assert admit(mgr, r2) == ([1, 2, 3], [5], 48)
    r3 = make_request("r3", A[:48])  # exactly 3 full blocks: hits 2, recomputes the third
    assert admit(mgr, r3) == ([1, 2], [6], 32)
    r4 = make_request("r4", A, cache_salt="s1")
    assert admit(mgr, r4) == ([], [7, 8, 9, 10], 0)
    r4b = make_request("r4b", A, cache_salt="s1")
    assert admit(mgr, r4b) == ([7, 8, 9], [11], 48)
    assert decode(mgr, r1) == []  # 51 tokens: the tail block still has room
    assert mgr.get_block_ids("r1") == [1, 2, 3, 4]
    mgr.free(r1)
    assert free_queue(mgr) == [4]
    for req in (r2, r3, r4, r4b):
        mgr.free(req)
        assert free_queue(mgr) == PARITY[f"free {req.request_id}"][pick]
    r5 = make_request("r5", list(range(1000, 1096)))  # 6 blocks, nothing shared
    assert admit(mgr, r5)[1] == PARITY["r5"][pick]
    r6 = make_request("r6", A + [1])
    num_hit, hit, new = PARITY["r6"][pick]
    assert admit(mgr, r6) == (hit, new, num_hit)
    r7 = make_request("r7", list(range(2000, 2128)))  # 8 blocks, 1 free
    assert admit(mgr, r7)[1] is None
    assert free_queue(mgr) == [7]
    mgr.free(r5)
    mgr.free(r6)
    assert mgr.num_free_blocks == mgr.num_usable_blocks == 11


def test_full_prompt_hit_recomputes_the_last_block():
    mgr = make_manager(10, block_size=4)
    first = make_request("a", list(range(12)))  # exactly 3 blocks
    admit(mgr, first)
    for n_tokens, expected_hit in [(12, 8), (13, 12), (11, 8), (8, 4), (4, 0), (1, 0)]:
        req = make_request(f"q{n_tokens}", list(range(n_tokens)))
        blocks, num_hit = mgr.get_computed_blocks(req)
        assert num_hit == expected_hit, n_tokens
        assert len(blocks) * 4 == num_hit
    assert mgr.block_pool.get_num_free_blocks() == 6  # lookups touch nothing


def test_generated_tokens_are_cached_as_blocks_fill():
    mgr = make_manager(10, block_size=16)
    req = make_request("a", list(range(30)))
    admit(mgr, req)
    assert mgr.num_cached_block["a"] == 1 and len(req.block_hashes) == 1
    decode(mgr, req, 30)
    assert mgr.num_cached_block["a"] == 1  # 31 tokens
    decode(mgr, req, 31)  # 32 tokens: the second block is full and cached now
    assert mgr.num_cached_block["a"] == 2 and len(req.block_hashes) == 2
    for t in (32, 33):
        decode(mgr, req, t)
    follow_up = make_request("b", list(range(34)) + [99])  # previous prompt + answer + more
    assert admit(mgr, follow_up)[2] == 32


def test_blocks_are_cached_at_allocation_before_compute():
    # Two requests admitted in one step: the second already hits the first's blocks.
    mgr = make_manager(12, block_size=4)
    a = make_request("a", list(range(10)))
    assert admit(mgr, a) == ([], [1, 2, 3], 0)
    b = make_request("b", list(range(9)) + [50])
    assert admit(mgr, b) == ([1, 2], [4], 8)
    assert [mgr.block_pool.blocks[i].ref_cnt for i in (1, 2, 3, 4, 5)] == [2, 2, 1, 1, 0]


def test_chunked_prefill_caches_each_chunk_and_hits_it():
    mgr = make_manager(12, block_size=4)
    a = make_request("a", list(range(14)))
    assert admit(mgr, a, num_new_tokens=6) == ([], [1, 2], 0)  # tokens 0..5
    assert mgr.num_cached_block["a"] == 1
    b = make_request("b", list(range(14)))
    assert mgr.get_computed_blocks(b)[1] == 4
    new = mgr.allocate_slots(a, 8)  # the rest of the prompt
    assert new.get_block_ids() == [3, 4]
    assert mgr.num_cached_block["a"] == 3
    assert mgr.get_computed_blocks(b)[1] == 12


def test_lru_eviction_order_with_events():
    mgr = make_manager(8, block_size=4, enable_kv_cache_events=True)
    a = make_request("a", list(range(8)) + [90])  # blocks 1, 2 full, 3 partial
    b = make_request("b", list(range(20, 28)) + [91])  # 4, 5 full, 6 partial
    admit(mgr, a)
    admit(mgr, b)
    assert mgr.take_events() == [
        BlockStored((1, 2), tuple(a.block_hashes)),
        BlockStored((4, 5), tuple(b.block_hashes)),
    ]
    mgr.free(a)
    mgr.free(b)
    # Partial blocks to the head (reused first); full blocks to the tail, each request's
    # last block first.
    assert free_queue(mgr) == [6, 3, 7, 2, 1, 5, 4]
    c = make_request("c", list(range(40, 56)))  # 4 full blocks
    assert admit(mgr, c)[1] == [6, 3, 7, 2]
    assert mgr.take_events() == [
        BlockRemoved(2, a.block_hashes[1]),
        BlockStored((6, 3, 7, 2), tuple(c.block_hashes)),
    ]
    d = make_request("d", list(range(20, 28)) + [91])  # b again: its blocks survived
    assert admit(mgr, d) == ([4, 5], [1], 8)
    assert mgr.take_events()[0] == BlockRemoved(1, a.block_hashes[0])
    e = make_request("e", list(range(8)) + [90])  # a again: evicted, and no room
    assert admit(mgr, e) == ([], None, 0)


def test_salt_isolation_and_sharing():
    mgr = make_manager(20, block_size=4)
    tokens = list(range(17))
    admit(mgr, make_request("plain", tokens))
    assert admit(mgr, make_request("s1", tokens, cache_salt="t1"))[2] == 0
    assert admit(mgr, make_request("s2", tokens, cache_salt="t2"))[2] == 0
    assert admit(mgr, make_request("s1b", tokens, cache_salt="t1"))[2] == 16
    assert admit(mgr, make_request("plain2", tokens))[2] == 16


def test_lora_isolation():
    mgr = make_manager(20, block_size=4)
    tokens = list(range(9))
    admit(mgr, make_request("base", tokens))
    assert admit(mgr, make_request("l1", tokens, lora_name="a"))[2] == 0
    assert admit(mgr, make_request("l1b", tokens, lora_name="a"))[2] == 8
    assert admit(mgr, make_request("l2", tokens, lora_name="b"))[2] == 0


def test_identical_blocks_are_not_deduplicated():
    mgr = make_manager(10, block_size=4)
    a = make_request("a", list(range(8)))
    b = make_request("b", list(range(8)))
    admit(mgr, a)  # [1, 2]
    assert admit(mgr, b) == ([1], [3], 4)  # block 3 repeats block 2's content
    assert mgr.block_pool.blocks[3].block_hash == mgr.block_pool.blocks[2].block_hash
    assert mgr.block_pool.get_cached_block(a.block_hashes[1]).block_id == 2  # first wins
    mgr.free(a)
    mgr.free(b)
    assert free_queue(mgr) == [4, 5, 6, 7, 8, 9, 2, 3, 1]


def test_caching_disabled():
    mgr = make_manager(8, block_size=4, enable_caching=False)
    a = make_request("a", list(range(9)))
    assert admit(mgr, a) == ([], [1, 2, 3], 0)
    assert a.block_hashes == []  # nothing is hashed
    b = make_request("b", list(range(9)))
    assert admit(mgr, b) == ([], [4, 5, 6], 0)
    mgr.free(a)
    assert free_queue(mgr) == [3, 2, 1, 7]  # 0.33: unhashed blocks are reused first
    assert mgr.prefix_cache_stats.queries == 0
