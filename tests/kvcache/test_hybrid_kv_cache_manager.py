"""The hybrid KV cache manager: KV cache groups over one pool, pinned block by block.

Layout of most tests: group 0 a sliding window of 8 tokens, group 1 full attention (gpt-oss's
order, alternating), blocks of 4 tokens. A sliding hit needs ceil((8 - 1) / 4) = 2 cached blocks
right before the next query.
"""

from __future__ import annotations

import pytest
from kv_helpers import free_queue, make_request

from pagesim.errors import AllocationError, ConfigError
from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.invariants import InvariantViolation, check_kv_cache_manager
from pagesim.kvcache.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from pagesim.specs import ModelSpec

BS = 4


def manager(num_blocks: int, *windows: int | None, **kw) -> HybridKVCacheManager:
    groups = tuple(
        KVCacheGroupSpec(1, FullAttentionSpec(BS) if w is None else SlidingWindowSpec(BS, w))
        for w in windows or (8, None)
    )
    return HybridKVCacheManager(KVCacheConfig(num_blocks, groups), check_invariants=True, **kw)


def admit(mgr: HybridKVCacheManager, req, num_new: int | None = None):
    hit, num_hit = mgr.get_computed_blocks(req)
    n = req.num_tokens - num_hit if num_new is None else num_new
    new = mgr.allocate_slots(req, n, num_hit, hit)
    if new is not None:
        req.num_computed_tokens = num_hit + n
    return hit.get_block_ids(), num_hit, new


def decode(mgr: HybridKVCacheManager, req, token: int = 7):
    req.output_token_ids.append(token)
    new = mgr.allocate_slots(req, 1)
    assert new is not None
    req.num_computed_tokens += 1
    return new.get_block_ids()


def test_groups_take_their_blocks_in_group_order_and_free_group_by_group():
    mgr = manager(20)
    a = make_request("a", list(range(10)))  # 3 blocks per group, the last one partial
    assert admit(mgr, a)[1] == 0
    assert mgr.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    mgr.free(a)
    # group 0 then group 1, each tail first: unhashed partial blocks to the head (0.33's
    # order, 3 before 6 reaches the head first), full blocks to the tail
    assert free_queue(mgr) == [6, 3, *range(7, 20), 2, 1, 5, 4]


def test_window_frees_blocks_out_of_reach_and_a_hit_needs_only_the_window():
    mgr = manager(40)
    a = make_request("a", list(range(32)))
    admit(mgr, a)
    assert mgr.get_block_ids("a") == ([1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16])
    assert decode(mgr, a) == ([17], [18])
    # the next query (position 32) sees 25..32: blocks 0-5 of the window group are freed,
    # the last dead one first, and replaced by the null block; full attention keeps all
    assert mgr.get_block_ids("a") == (
        [0, 0, 0, 0, 0, 0, 7, 8, 17],
        [9, 10, 11, 12, 13, 14, 15, 16, 18],
    )
    assert free_queue(mgr) == [*range(19, 40), 6, 5, 4, 3, 2, 1]
    b = make_request("b", [*range(32), 7, 9])
    hit, num_hit, _ = admit(mgr, b, 2)
    assert num_hit == 32
    assert hit == ([0, 0, 0, 0, 0, 0, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16])
    assert mgr.get_block_ids("b") == (
        [0, 0, 0, 0, 0, 0, 7, 8, 19],
        [9, 10, 11, 12, 13, 14, 15, 16, 20],
    )


def test_hit_is_the_longest_prefix_every_group_serves():
    mgr = manager(24)
    a = make_request("a", list(range(32)))
    admit(mgr, a)
    mgr.free(a)
    # another request reuses the window group's freed blocks 8..2 (its tail, freed first):
    # full attention still holds all 8 blocks of the prompt, the window group only block 0
    c = make_request("c", list(range(1000, 1025)))
    admit(mgr, c)
    assert mgr.get_block_ids("c") == ([17, 18, 19, 20, 21, 22, 23], [8, 7, 6, 5, 4, 3, 2])
    hit, num_hit = mgr.get_computed_blocks(make_request("b", list(range(33))))
    assert (hit.get_block_ids(), num_hit) == (([1], [9]), 4)


def test_several_specs_iterate_to_a_length_every_group_accepts():
    """Windows of 8 and 16 tokens and full attention: three specs, so the coordinator loops
    until no spec lowers the length. Block 9 of the 8-window group and block 11 of the
    16-window group are evicted: the 16-window (4 blocks in a row) lowers 52 to 44, at 44 the
    8-window (2 in a row) lowers it to 36, which every spec then accepts."""
    mgr = manager(80, 8, 16, None)
    a = make_request("a", list(range(40)))
    admit(mgr, a)
    for _ in range(12):
        decode(mgr, a)
    mgr.free(a)
    b = make_request("b", [*range(40), *a.output_token_ids, 5])
    assert mgr.get_computed_blocks(b)[1] == 52
    pool = mgr.block_pool
    for group, index in ((0, 9), (1, 11)):
        block = pool.get_cached_block(b.block_hashes[index] + group.to_bytes(2, "big"))
        assert block is not None
        pool.evict_cached_block(block)
    hit, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 36
    window8, window16, full = hit.get_block_ids()
    assert 0 in window8 and 0 in window16 and 0 not in full
    assert len(window8) == len(window16) == len(full) == 9
    coordinator = mgr.coordinator
    for spec, group_ids in coordinator.attention_groups:
        members = [coordinator.single_type_managers[g] for g in group_ids]
        _, length = type(members[0]).find_longest_cache_hit(members, b.block_hashes, num_hit)
        assert length == num_hit, spec


def test_failed_allocation_changes_nothing_and_too_big_raises():
    mgr = manager(9)  # 8 usable blocks: 4 per group
    a = make_request("a", list(range(20)))  # 5 blocks per group
    queue = free_queue(mgr)
    assert mgr.allocate_slots(a, 20) is None
    assert free_queue(mgr) == queue and mgr.get_block_ids("a") == ([], [])
    assert mgr.can_fit(20)  # in chunks: the window group holds at most 3 blocks at a time
    assert not mgr.can_fit(24)  # full attention alone needs 6 of the 8
    with pytest.raises(AllocationError):
        mgr.allocate_slots(make_request("big", list(range(80))), 80)


def test_invariant_checker_sees_a_null_block_in_full_attention():
    mgr = manager(20)
    a = make_request("a", list(range(10)))
    admit(mgr, a)
    full = mgr.single_type_managers[1]
    full.req_to_blocks["a"][0] = mgr.block_pool.null_block
    full.req_to_block_ids["a"][0] = 0
    with pytest.raises(InvariantViolation, match="null block in a full-attention row"):
        check_kv_cache_manager(mgr)


def test_model_layouts_become_vllm_kv_cache_groups():
    gemma = KVCacheConfig.from_model(ModelSpec.from_name("gemma-2-9b"), 16, 100)
    assert [type(g.kv_cache_spec).__name__ for g in gemma.kv_cache_groups] == [
        "SlidingWindowSpec",
        "FullAttentionSpec",
    ]
    assert gemma.kv_cache_groups[0].kv_cache_spec == SlidingWindowSpec(16, 4096)
    oss = KVCacheConfig.from_model(ModelSpec.from_name("gpt-oss-20b"), 16, 100)
    assert [g.kv_cache_spec for g in oss.kv_cache_groups] == [
        SlidingWindowSpec(16, 128),
        FullAttentionSpec(16),
    ]
    with pytest.raises(ConfigError, match="block sizes"):
        KVCacheConfig(
            10,
            (KVCacheGroupSpec(1, FullAttentionSpec(16)), KVCacheGroupSpec(1, FullAttentionSpec(8))),
        )
