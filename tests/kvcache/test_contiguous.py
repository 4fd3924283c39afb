"""Contiguous baselines: region size per policy, placement, rows, failures, invariants."""

from __future__ import annotations

import pytest

from pagesim.errors import AllocationError, ConfigError, InternalError
from pagesim.kvcache.buddy import Region
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.invariants import InvariantViolation
from pagesim.request import Request


def _req(rid: str, prompt: int, max_tokens: int) -> Request:
    return Request(rid, list(range(prompt)), max_tokens=max_tokens)


def _mgr(
    policy: str,
    placement: str = "buddy",
    num_gpu_blocks: int = 65,
    block_size: int = 16,
    max_model_len: int = 512,
) -> ContiguousKVCacheManager:
    return ContiguousKVCacheManager(
        num_gpu_blocks,
        block_size,
        policy,
        placement,
        max_model_len=max_model_len,
        check_invariants=True,
    )


@pytest.mark.parametrize(
    "policy, placement, units",
    [
        # final length 100 + 30 = 130 tokens, block 16
        ("reserve-max", "buddy", 32),  # 512 tokens = 32 blocks
        ("reserve-max", "first-fit", 32),
        ("pow2", "buddy", 16),  # 256 tokens = 16 blocks
        ("pow2", "first-fit", 16),
        ("oracle", "first-fit", 9),  # 130 tokens -> 9 blocks (144 slots)
        ("oracle", "buddy", 9),  # 9 blocks: the buddy splits its block of 16 exactly
    ],
)
def test_region_size_per_policy(policy, placement, units):
    m = _mgr(policy, placement)
    r = _req("a", 100, 30)
    assert m.region_units(r.max_num_tokens) == units
    blocks = m.allocate_slots(r, 100)
    assert blocks is not None
    res = m.reservations["a"]
    assert res.region == Region(0, units)
    assert res.final_kv_len == 129
    # the row covers the 100 prompt tokens: 7 blocks, ids from 1 (block 0 is the null block)
    assert m.get_block_ids("a") == [1, 2, 3, 4, 5, 6, 7]
    assert blocks.get_block_ids() == [1, 2, 3, 4, 5, 6, 7]
    assert m.num_free_blocks == 64 - units
    assert m.usage == pytest.approx(units / 64)
    assert m.num_reserved_slots == units * 16
    assert m.num_fillable_slots == min(units * 16, 129)


def test_region_tokens_capped_and_token_granular():
    m = _mgr("pow2", max_model_len=300)
    assert m.region_tokens(130) == 256
    assert m.region_tokens(260) == 300  # 512 capped at max_model_len
    assert _mgr("oracle", max_model_len=300).region_tokens(500) == 300
    t = ContiguousKVCacheManager(1001, 1, "oracle", "first-fit", max_model_len=512)
    assert t.region_units(130) == 130  # block_size 1: token-granular regions


def test_later_calls_only_extend_the_row():
    m = _mgr("oracle", "first-fit")
    r = _req("a", 20, 40)  # 60 tokens -> 4 blocks
    assert m.allocate_slots(r, 16).get_block_ids() == [1]
    r.num_computed_tokens = 16
    assert m.allocate_slots(r, 4).get_block_ids() == [2]
    r.num_computed_tokens = 20
    r.output_token_ids.append(7)
    assert len(m.allocate_slots(r, 1)) == 0  # slot 21 is still in block 2
    assert m.get_block_ids("a") == [1, 2]
    assert m.num_free_blocks == 60  # the region was taken once, at the first call
    r.num_computed_tokens = 58
    with pytest.raises(InternalError, match="needs 66 slots"):
        m.allocate_slots(r, 8)  # beyond the oracle region of 64 slots


def test_buddy_placement_and_failure_changes_nothing():
    m = _mgr("reserve-max", "buddy", num_gpu_blocks=97)  # 96 usable = 64 + 32
    a, b, c = _req("a", 10, 10), _req("b", 10, 10), _req("c", 10, 10)
    assert m.allocate_slots(a, 10) is not None
    assert m.allocate_slots(b, 10) is not None
    assert (m.reservations["a"].region, m.reservations["b"].region) == (
        Region(64, 32),
        Region(0, 32),
    )
    assert m.get_block_ids("a") == [65]
    assert m.get_block_ids("b") == [1]
    assert m.allocate_slots(c, 10) is not None
    assert m.reservations["c"].region == Region(32, 32)
    d = _req("d", 10, 10)
    assert m.allocate_slots(d, 10) is None
    assert "d" not in m.reservations and m.get_block_ids("d") == [] and m.num_free_blocks == 0
    m.free(b)
    assert m.allocator.free_regions() == [Region(0, 32)]
    m.free(c)  # merges with b's block into [0, 64)
    assert m.allocator.free_regions() == [Region(0, 64)]
    m.free(a)
    m.free(a)  # freeing twice is a no-op, as in the paged manager
    assert m.allocator.free_regions() == [Region(0, 64), Region(64, 32)]
    assert m.num_reserved_slots == 0 and m.num_fillable_slots == 0


def test_external_fragmentation_is_real_with_first_fit():
    m = _mgr("oracle", "first-fit", num_gpu_blocks=11, block_size=1, max_model_len=10)
    reqs = [_req(f"r{i}", 2, 1) for i in range(5)]  # 3 tokens each; 10 usable slots
    for r in reqs[:3]:
        assert m.allocate_slots(r, 2) is not None
    m.free(reqs[0])
    m.free(reqs[2])  # holes [0,3) and [6,10)
    assert m.allocator.free_regions() == [Region(0, 3), Region(6, 4)]
    big = _req("big", 4, 2)  # 6 slots: 7 are free, no hole holds 6
    assert m.allocate_slots(big, 4) is None
    assert m.allocate_slots(reqs[3], 2) is not None
    assert m.reservations["r3"].region == Region(0, 3)  # lowest hole first


def test_no_prefix_cache_and_stats():
    m = _mgr("pow2")
    r = _req("a", 40, 5)
    blocks, hit = m.get_computed_blocks(r)
    assert (len(blocks), hit) == (0, 0)
    m.allocate_slots(
        r,
        40,
        num_new_computed_tokens=0,
        new_computed_blocks=blocks,
        num_lookahead_tokens=0,
        full_sequence_must_fit=True,
    )
    assert (m.prefix_cache_stats.queries, m.prefix_cache_stats.hits) == (40, 0)
    assert m.make_prefix_cache_stats().requests == 1
    assert m.make_prefix_cache_stats().requests == 0
    assert m.take_blocks_to_copy() == [] and m.take_events() == []
    with pytest.raises(InternalError, match="no prefix cache"):
        m.allocate_slots(_req("b", 40, 5), 8, num_new_computed_tokens=32)
    with pytest.raises(AllocationError, match="cannot share"):
        m.fork(r, _req("c", 40, 5))


def test_resume_after_free_takes_a_new_region():
    m = _mgr("oracle", "first-fit")
    a, b = _req("a", 30, 2), _req("b", 30, 2)
    m.allocate_slots(a, 30)
    m.allocate_slots(b, 30)
    m.free(a)  # preempted (recompute)
    a.num_computed_tokens = 0
    a.num_preemptions = 1
    m.allocate_slots(a, 30)
    assert m.reservations["a"].region == Region(0, 2)
    assert m.prefix_cache_stats.preempted_requests == 1


def test_errors():
    with pytest.raises(ConfigError, match="policy='best'"):
        ContiguousKVCacheManager(10, 16, "best", max_model_len=64)
    with pytest.raises(ConfigError, match="placement='worst-fit'"):
        ContiguousKVCacheManager(10, 16, "oracle", "worst-fit", max_model_len=64)
    with pytest.raises(ConfigError, match="num_gpu_blocks=1"):
        ContiguousKVCacheManager(1, 16, "oracle", max_model_len=64)
    m = _mgr("reserve-max", num_gpu_blocks=20)  # 19 usable, buddy max block 16 < 32
    assert not m.can_fit(10)
    with pytest.raises(AllocationError, match="can never be placed"):
        m.allocate_slots(_req("a", 10, 10), 10)
    assert _mgr("oracle", num_gpu_blocks=20).can_fit_request(_req("a", 10, 10))
    with pytest.raises(InternalError, match="num_new_tokens=0"):
        m.allocate_slots(_req("a", 10, 10), 0)


def test_invariant_checker_catches_corruption():
    m = _mgr("oracle", "first-fit")
    r = _req("a", 30, 2)
    m.allocate_slots(r, 30)
    m.check_invariants()
    m.reservations["a"].row.append(99)
    with pytest.raises(InvariantViolation, match="prefix of its region"):
        m.check_invariants()
    m.reservations["a"].row.pop()
    m.num_reserved_slots += 1
    with pytest.raises(InvariantViolation, match="num_reserved_slots"):
        m.check_invariants()


def test_runs_under_the_scheduler():
    from pagesim.config import EngineConfig
    from pagesim.scheduler.output import ModelRunnerOutput
    from pagesim.sim.build import build_scheduler

    for allocator in ("reserve-max", "pow2", "oracle"):
        cfg = EngineConfig.create(
            model="tiny-llama",
            gpu="a10g",
            num_gpu_blocks_override=40,
            max_model_len=256,
            max_num_seqs=8,
            max_num_batched_tokens=256,
            allocator=allocator,
        )
        s = build_scheduler(cfg, check_invariants=True)
        assert isinstance(s.kv_cache_manager, ContiguousKVCacheManager)
        for i in range(12):
            s.add_request(_req(f"r{i}", 20 + 9 * i, 5 + i))
        finished = 0
        for _ in range(500):
            if not s.has_unfinished_requests():
                break
            out = s.schedule()
            sampled = {
                sr.request_id: 1
                for sr in out.scheduled
                if sr.num_computed_tokens + sr.num_new_tokens >= sr.request.num_tokens
            }
            finished += len(s.update_from_output(out, ModelRunnerOutput(0.01, sampled)))
        assert finished == 12
        s.kv_cache_manager.check_invariants()
        assert s.kv_cache_manager.num_free_blocks == 39
