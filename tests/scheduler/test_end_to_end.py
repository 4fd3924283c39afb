"""Whole runs: random workloads under every mode keep the scheduler's invariants, finish every
accepted request with exactly max_tokens, lose nothing, and repeat byte for byte. Plus the
contiguous baselines running under the same scheduler."""

from __future__ import annotations

import random

import pytest
from sched_helpers import make_config, make_kv, req, run_step, tables, tokens

from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.request import Request, RequestStatus
from pagesim.scheduler import CPUSwapPool, Scheduler


def workload(seed: int, n: int, block_size: int) -> list[list[Request]]:
    """Arrival batches (one per step) of requests sharing a few prefixes."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(50_000) for _ in range(rng.choice([0, block_size, 3 * block_size]))]
        for _ in range(3)
    ]
    batches: list[list[Request]] = []
    for i in range(n):
        prompt = rng.choice(prefixes) + [rng.randrange(50_000) for _ in range(rng.randrange(1, 40))]
        r = req(
            f"r{i}",
            prompt,
            max_tokens=rng.randrange(1, 12),
            priority=rng.randrange(3),
            arrival_time=float(i),
        )
        if rng.random() < 0.5 or not batches:
            batches.append([])
        batches[-1].append(r)
    batches[-1].append(req("too-long", 300, max_tokens=1))  # rejected: prompt > max_model_len
    return batches


def check_step(s: Scheduler, out, seen_preempted: set[str]) -> None:
    cfg = s.config
    scheduled = [sr.request_id for sr in out.scheduled]
    assert len(set(scheduled)) == len(scheduled)
    assert out.total_num_scheduled_tokens == sum(sr.num_new_tokens for sr in out.scheduled)
    assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
    assert len(s.running) <= cfg.max_num_seqs
    if out.preempted_req_ids:  # no admission in a step that preempted
        assert not any(sr.first_scheduled for sr in out.scheduled)
    for sr in out.scheduled:
        r = sr.request
        assert sr.num_new_tokens >= 1
        assert sr.num_computed_tokens + sr.num_new_tokens <= r.num_tokens
        assert sr.num_prefix_hit_tokens % cfg.block_size == 0
        assert sr.num_prefix_hit_tokens < r.num_tokens
        if r.num_output_tokens and sr.num_computed_tokens == r.num_tokens - 1:
            assert sr.num_new_tokens == 1  # one token per decode step
        num_slots = len(tables(s)[sr.request_id]) * cfg.block_size
        assert num_slots >= sr.num_computed_tokens + sr.num_new_tokens
    seen_preempted.update(out.preempted_req_ids)


def run_all(seed: int, **kw) -> tuple[Scheduler, list[Request], list]:
    pool = CPUSwapPool(6, 1000) if kw.get("preemption_mode") == "swap" else None
    cfg = make_config(
        **{
            "block_size": 4,
            "max_num_seqs": 6,
            "max_num_batched_tokens": 48,
            "max_model_len": 128,
            **kw,
        }
    )
    s = Scheduler(cfg, make_kv(24, block_size=4), swap_pool=pool)
    batches = workload(seed, 40, 4)
    added: list[Request] = []
    log, preempted = [], set()
    step = 0
    while step < len(batches) or s.has_unfinished_requests():
        for r in batches[step] if step < len(batches) else ():
            s.add_request(r)
            added.append(r)
        out, _ = run_step(s)
        check_step(s, out, preempted)
        log.append(
            (
                tokens(out),
                [list(tables(s)[sr.request_id]) for sr in out.scheduled],
                out.preempted_req_ids,
                out.blocks_to_swap_out,
                out.blocks_to_swap_in,
            )
        )
        step += 1
        assert step < 5000
    return s, added, log


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("chunked", [True, False])
def test_random_runs_keep_invariants_and_lose_nothing(policy, mode, chunked) -> None:
    kw = dict(scheduling_policy=policy, preemption_mode=mode, enable_chunked_prefill=chunked)
    if not chunked:
        kw["max_num_batched_tokens"] = 128
    s, added, log = run_all(7, **kw)
    for r in added:
        if r.status == RequestStatus.FINISHED_REJECTED:
            assert r.reject_reason
        else:
            assert r.status == RequestStatus.FINISHED_LENGTH
            assert r.num_output_tokens == r.max_tokens
    st = s.stats
    assert st.num_added == len(added) and st.num_rejected == 1
    assert st.num_finished + st.num_rejected == st.num_added
    assert st.num_preemptions > 0  # the cache is small enough to force some
    assert s.kv_cache_manager.num_free_blocks == s.kv_cache_manager.num_usable_blocks
    if mode == "swap":
        assert s.swap_pool.num_free_blocks == s.swap_pool.num_blocks
        assert st.swapped_out_blocks == st.swapped_in_blocks
    # same seed, same decisions
    assert run_all(7, **kw)[2] == log


@pytest.mark.parametrize("policy,concurrent", [("reserve-max", 2), ("oracle", 3)])
def test_contiguous_baseline_under_the_scheduler(policy: str, concurrent: int) -> None:
    cfg = make_config(max_model_len=64, max_num_batched_tokens=64)
    kv = ContiguousKVCacheManager(
        9, 16, policy, "first-fit", max_model_len=64, check_invariants=True
    )
    s = Scheduler(cfg, kv)
    rs = [req(f"r{i}", 10, max_tokens=5) for i in range(3)]
    for r in rs:
        s.add_request(r)
    # reserve-max: 4 blocks (64 slots) per request in 8 usable blocks; oracle: 1 block each
    out, _ = run_step(s)
    assert len(out.scheduled) == concurrent
    assert out.scheduled[0].block_ids == [1]
    while s.has_unfinished_requests():
        run_step(s)
    assert all(r.num_output_tokens == 5 for r in rs)
    assert kv.num_free_blocks == 8


def test_contiguous_rejects_what_its_region_cannot_hold() -> None:
    cfg = make_config(max_model_len=256)
    kv = ContiguousKVCacheManager(9, 16, "reserve-max", "first-fit", max_model_len=256)
    s = Scheduler(cfg, kv)  # a 256-slot region needs 16 blocks, the cache has 8
    r = req("r", 10, max_tokens=5)
    assert not s.add_request(r) and r.reject_reason.startswith("kv_cache_too_small")
