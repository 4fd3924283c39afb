"""`simulate()` end to end on small workloads: nothing lost, KV drained and consistent,
rejections with reasons, `--max-concurrency`, arrivals (inf, rate, trace) and result keys."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError, InternalError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.invariants import check_kv_cache_manager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.request import Request
from pagesim.scheduler.factory import make_scheduler
from pagesim.sim.build import build_cost_model
from pagesim.sim.output import result_json
from pagesim.sim.simulate import LoadSpec, SimulationResult, result_metadata, simulate
from pagesim.workload import load_workload

E = EngineConfig.create
RANDOM = dict(
    workload="random", random_input_len=200, random_output_len=100, random_range_ratio=0.5
)


def assert_nothing_lost(sim: SimulationResult, num_prompts: int) -> None:
    res, records = sim.result, sim.metrics.records
    assert len(records) == num_prompts
    assert res["completed"] + res["num_rejected"] == num_prompts
    assert res["failed"] == res["num_rejected"]
    assert sum(res["rejected_reasons"].values()) == res["num_rejected"]
    for rec in records.values():
        assert rec.finish_time is not None
        if rec.reject_reason is None:
            assert rec.num_output_tokens == rec.max_tokens
            assert rec.arrival_time <= rec.first_scheduled_time <= rec.first_token_time
            assert rec.first_token_time <= rec.last_token_time == rec.finish_time
        else:
            assert rec.num_output_tokens == 0 and rec.first_token_time is None


def assert_drained(scheduler) -> None:
    """Every block free or cached-free, and the allocator's own checks pass."""
    kv = scheduler.kv_cache_manager
    if isinstance(kv, ContiguousKVCacheManager):
        kv.check_invariants()
    else:
        check_kv_cache_manager(kv)
    assert kv.num_free_blocks == kv.num_usable_blocks
    assert not scheduler.has_unfinished_requests() and not scheduler.requests


CHECKED_RUNS = {
    "chat": (
        dict(num_gpu_blocks_override=256, block_size=32),
        dict(workload="chat", num_prompts=6),
    ),
    "system-prompt": (
        dict(num_gpu_blocks_override=128, block_size=32),
        dict(workload="system-prompt", num_prompts=8),
    ),
    "multi-turn": (
        dict(num_gpu_blocks_override=128, block_size=32),
        dict(workload="multi-turn", num_prompts=12),
    ),
    "mooncake-conversation": (
        dict(
            model="llama-3.1-8b", num_gpu_blocks_override=160, block_size=128, max_model_len=32768
        ),
        dict(workload="mooncake-conversation", num_prompts=4),
    ),
    "random-pressure": (dict(num_gpu_blocks_override=48), dict(num_prompts=30, **RANDOM)),
    "random-swap": (
        dict(num_gpu_blocks_override=48, preemption_mode="swap"),
        dict(num_prompts=30, **RANDOM),
    ),
    "random-no-prefix-caching": (
        dict(num_gpu_blocks_override=48, enable_prefix_caching=False),
        dict(num_prompts=20, **RANDOM),
    ),
    # hybrid models: sliding-window and full-attention groups under the hybrid manager
    "gpt-oss-pressure": (
        dict(model="gpt-oss-20b", num_gpu_blocks_override=96, block_size=16),
        dict(num_prompts=30, **RANDOM),
    ),
    "gemma-2-system-prompt": (
        dict(model="gemma-2-9b", num_gpu_blocks_override=256, block_size=16),
        dict(workload="system-prompt", num_prompts=8),
    ),
    **{
        f"{alloc}-{place}": (
            dict(
                num_gpu_blocks_override=128,
                max_model_len=1024,
                allocator=alloc,
                contiguous_placement=place,
            ),
            dict(num_prompts=20, **RANDOM),
        )
        for alloc in ("reserve-max", "pow2", "oracle")
        for place in ("buddy", "first-fit")
    },
}


@pytest.mark.parametrize("name", list(CHECKED_RUNS))
def test_invariants_hold_and_every_block_comes_back(name: str, built_schedulers) -> None:
    engine, load = CHECKED_RUNS[name]
    sim = simulate(E(**engine), LoadSpec(**load), check_invariants=True)
    assert_nothing_lost(sim, load["num_prompts"])
    assert sim.result["completed"] > 0
    (scheduler,) = built_schedulers
    assert_drained(scheduler)
    if name.startswith("random-pressure"):
        assert sim.result["num_preemptions"] > 0 and sim.result["recomputed_tokens"] > 0
    if name == "random-swap":
        assert sim.result["num_swap_preemptions"] > 0
        assert sim.result["swapped_out_bytes"] == sim.result["swapped_in_bytes"] > 0
    if name in ("system-prompt", "multi-turn", "gemma-2-system-prompt"):
        assert sim.result["prefix_cache_hit_rate"] > 0
    if name == "gpt-oss-pressure":
        assert sim.result["num_preemptions"] > 0


def test_hybrid_models_get_one_block_table_per_kv_cache_group(built_schedulers) -> None:
    """gpt-oss (alternating window-128 and full layers): two groups, window rows nulled."""
    engine = E(model="gpt-oss-20b", num_gpu_blocks_override=400)
    seen: list[tuple[list[int], ...]] = []
    hook = HybridKVCacheManager.allocate_slots

    def spy(self, request, *args, **kwargs):
        out = hook(self, request, *args, **kwargs)
        seen.append(self.get_block_ids(request.request_id))
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HybridKVCacheManager, "allocate_slots", spy)
        simulate(engine, LoadSpec(num_prompts=10, **RANDOM), check_invariants=True)
    (scheduler,) = built_schedulers
    assert isinstance(scheduler.kv_cache_manager, HybridKVCacheManager)
    assert all(len(rows) == 2 for rows in seen)
    assert any(0 in window for window, _ in seen) and not any(0 in full for _, full in seen)
    with pytest.raises(ConfigError, match="recompute only"):
        simulate(E(model="gpt-oss-20b", preemption_mode="swap"), LoadSpec(num_prompts=2))
    # --disable-hybrid-kv-cache-manager: one full-attention table
    single = make_scheduler(
        engine.replace(disable_hybrid_kv_cache_manager=True), 400
    ).kv_cache_manager
    assert type(single) is KVCacheManager and single.sliding_window is None


def test_drained_check_catches_a_leak() -> None:
    """simulate's end-of-run check fails when a request still holds blocks."""
    from pagesim.sim.simulate import _check_drained, check_no_leak

    kv = KVCacheManager(num_gpu_blocks=8, block_size=16)
    r = Request("held", list(range(20)), 4)
    assert kv.allocate_slots(r, 20) is not None
    with pytest.raises(InternalError, match="leaked"):
        check_no_leak(kv)
    kv.free(r)
    _check_drained(kv)
    check_no_leak(kv)


def test_unservable_requests_are_rejected_with_their_reason() -> None:
    """max_model_len 256, prompts 150..450 and outputs 8..24 tokens: too long, too long with
    its output, or served."""
    load = LoadSpec(
        workload="random",
        num_prompts=40,
        random_input_len=300,
        random_output_len=16,
        random_range_ratio=0.5,
    )
    sim = simulate(E(max_model_len=256), load)
    assert_nothing_lost(sim, 40)
    reasons = sim.result["rejected_reasons"]
    assert reasons["prompt_too_long"] > 0 and reasons["max_tokens_too_large"] > 0
    assert sim.result["completed"] > 0
    for rec in sim.metrics.records.values():
        if rec.num_prompt_tokens > 256:
            expected = "prompt_too_long"
        elif rec.num_prompt_tokens + rec.max_tokens > 256:
            expected = "max_tokens_too_large"
        else:
            expected = None
        got = rec.reject_reason.split(":")[0] if rec.reject_reason else None
        assert got == expected, rec


def test_requests_larger_than_the_whole_cache_are_rejected() -> None:
    """8 blocks of 16 (7 usable: 112 slots); a request needs prompt + max_tokens - 1 slots."""
    load = LoadSpec(
        workload="random",
        num_prompts=30,
        random_input_len=80,
        random_output_len=8,
        random_range_ratio=0.5,
    )
    sim = simulate(E(num_gpu_blocks_override=8), load, check_invariants=True)
    assert_nothing_lost(sim, 30)
    assert set(sim.result["rejected_reasons"]) == {"kv_cache_too_small"}
    assert sim.result["num_rejected"] > 0 and sim.result["completed"] > 0
    for rec in sim.metrics.records.values():
        too_big = rec.num_prompt_tokens + rec.max_tokens - 1 > 112
        assert (rec.reject_reason is not None) == too_big, rec


def in_flight_peak(records) -> int:
    """Most requests between send and finish at any instant (a finish frees its slot first)."""
    events = []
    for r in records:
        events.append((r.arrival_time, 1))
        events.append((r.finish_time, -1))
    level = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        level += delta
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("cap", [1, 3])
def test_max_concurrency_is_honoured(cap: int) -> None:
    load = LoadSpec(
        workload="random",
        num_prompts=15,
        random_input_len=64,
        random_output_len=16,
        random_range_ratio=0.5,
        request_rate=math.inf,
        max_concurrency=cap,
    )
    sim = simulate(E(), load)
    assert_nothing_lost(sim, 15)
    records = list(sim.metrics.records.values())
    assert in_flight_peak(records) == cap
    assert sim.result["max_num_running"] <= cap
    uncapped = simulate(E(), LoadSpec(**{**load.__dict__, "max_concurrency": None}))
    assert in_flight_peak(list(uncapped.metrics.records.values())) == 15


def test_infinite_rate_sends_everything_at_zero() -> None:
    load = LoadSpec(
        workload="random",
        num_prompts=12,
        random_input_len=32,
        random_output_len=4,
        request_rate=math.inf,
    )
    sim = simulate(E(), load)
    assert [r.arrival_time for r in sim.metrics.records.values()] == [0.0] * 12


class _Doubled:
    """Every step twice the analytical model's."""

    def __init__(self, config: EngineConfig) -> None:
        self.base = build_cost_model(config, None)

    def step_time(self, batch) -> float:
        return 2.0 * self.base.step_time(batch)


def test_a_given_cost_model_prices_the_steps() -> None:
    """`cost_model=` replaces the profile's (or the analytical) model; all requests at t=0, so
    the schedule is the same and every time doubles."""
    cfg = E()
    load = LoadSpec(
        workload="random",
        num_prompts=12,
        random_input_len=32,
        random_output_len=4,
        request_rate=math.inf,
    )
    base = simulate(cfg, load).result
    assert simulate(cfg, load, cost_model=build_cost_model(cfg, None)).result == base
    doubled = simulate(cfg, load, cost_model=_Doubled(cfg)).result
    assert doubled["duration"] == pytest.approx(2 * base["duration"], rel=1e-9)
    assert doubled["mean_tpot_ms"] == pytest.approx(2 * base["mean_tpot_ms"], rel=1e-9)


def test_finite_rate_spreads_arrivals_to_num_over_rate() -> None:
    load = LoadSpec(
        workload="random",
        num_prompts=12,
        random_input_len=32,
        random_output_len=4,
        request_rate=4.0,
    )
    arrivals = sorted(r.arrival_time for r in simulate(E(), load).metrics.records.values())
    assert arrivals[0] > 0
    assert arrivals[-1] == pytest.approx(12 / 4.0, rel=1e-12)


@pytest.mark.parametrize("time_scale", [None, 2.0])
def test_trace_workloads_use_their_timestamps(time_scale: float | None) -> None:
    n = 10
    plan = load_workload("conversation").sample(n, seed=0, vocab_size=32000)
    expected = (plan.trace_times_s - plan.trace_times_s[0]) * (time_scale or 1.0)
    sim = simulate(E(), LoadSpec(workload="conversation", num_prompts=n, time_scale=time_scale))
    arrivals = np.array(sorted(r.arrival_time for r in sim.metrics.records.values()))
    np.testing.assert_allclose(arrivals, np.sort(expected), rtol=0, atol=1e-9)
    assert expected[-1] > 1.0  # a real spread, not everything at 0


def test_multi_turn_sessions_are_closed_loop() -> None:
    """Turn k+1 of a session is sent after turn k finished (plus a think time)."""
    sim = simulate(E(), LoadSpec(workload="multi-turn", num_prompts=16))
    by_session: dict[str, list] = {}
    for rec in sim.metrics.records.values():
        by_session.setdefault(rec.session_id, []).append(rec)
    assert len(by_session) >= 2 and any(len(v) > 1 for v in by_session.values())
    for turns in by_session.values():
        turns.sort(key=lambda r: r.arrival_time)
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.arrival_time > prev.finish_time


RESULT_KEYS = [
    "completed",
    "duration",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "max_concurrent_requests",
    "num_rejected",
    "num_preemptions",
    "mean_num_running",
    "max_num_running",
    "prefix_cache_hit_rate",
    "kv_cache_usage_mean",
    "kv_cache_usage_peak",
    "kv_token_state_frac",
    "kv_reserved_frac",
    "kv_internal_frag_frac",
    "kv_external_frag_frac",
] + [
    f"{stat}_{name}_ms"
    for name in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p99")
]


def test_result_has_vllm_bench_and_kv_keys() -> None:
    load = LoadSpec(workload="system-prompt", num_prompts=10, request_rate=20.0)
    sim = simulate(E(num_gpu_blocks_override=128, block_size=32), load)
    res = sim.result
    missing = [k for k in RESULT_KEYS if k not in res]
    assert not missing
    for key in RESULT_KEYS:
        assert isinstance(res[key], int | float) and math.isfinite(res[key]), key
        assert res[key] >= 0, key
    for key in ("kv_cache_usage_mean", "kv_cache_usage_peak", "prefix_cache_hit_rate"):
        assert 0 <= res[key] <= 1, key
    assert res["kv_cache_usage_mean"] <= res["kv_cache_usage_peak"]
    waste = sum(
        res[k]
        for k in (
            "kv_token_state_frac",
            "kv_reserved_frac",
            "kv_internal_frag_frac",
            "kv_external_frag_frac",
            "kv_free_frac",
        )
    )
    assert waste == pytest.approx(1.0, abs=1e-9)
    doc = json.loads(result_json(res, result_metadata(sim.config, load), date="20260101-000000"))
    assert list(doc)[:3] == ["date", "backend", "model_id"]
    assert doc["request_rate"] == 20.0 and doc["num_prompts"] == 10
    assert doc["completed"] == 10


def test_progress_hook_reaches_the_total() -> None:
    seen: list[tuple[int, int]] = []
    load = LoadSpec(workload="random", num_prompts=6, random_input_len=32, random_output_len=4)
    simulate(E(), load, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (6, 6) and [d for d, _ in seen] == list(range(1, 7))


def test_rejections_release_their_concurrency_slot() -> None:
    """Refused requests end at once and free their slot: no deadlock, nothing lost, and a
    multi-turn session goes on after a turn that outgrew max_model_len."""
    load = LoadSpec(
        workload="random",
        num_prompts=30,
        random_input_len=300,
        random_output_len=16,
        random_range_ratio=0.5,
        max_concurrency=1,
        request_rate=50.0,
    )
    sim = simulate(E(max_model_len=256), load)
    assert_nothing_lost(sim, 30)
    assert sim.result["num_rejected"] > 0 and sim.result["completed"] > 0
    turns = LoadSpec(workload="multi-turn", num_prompts=30, max_concurrency=2)
    sim = simulate(E(max_model_len=1024), turns)
    assert_nothing_lost(sim, 30)
    assert sim.result["num_rejected"] > 0 and sim.result["completed"] > 0
    assert in_flight_peak(list(sim.metrics.records.values())) <= 2


def test_every_run_checks_for_leaked_blocks_at_its_end(monkeypatch):
    """A block still held after all requests finished is a bug (InternalError, exit 1), found
    by every run, not only under --check-invariants."""
    from pagesim.errors import InternalError
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.sim import simulate as sim_module

    real_free = KVCacheManager.free
    leaked: list[str] = []

    def leaky_free(self, request):  # the first request's blocks are never returned
        if not leaked:
            leaked.append(request.request_id)
            return None
        return real_free(self, request)

    monkeypatch.setattr(KVCacheManager, "free", leaky_free)
    config = EngineConfig.create(model="llama-2-7b", gpu="h200")
    load = LoadSpec(workload="chat", num_prompts=5, request_rate=math.inf)
    with pytest.raises(InternalError, match="leaked"):
        sim_module.simulate(config, load, profile=None)
