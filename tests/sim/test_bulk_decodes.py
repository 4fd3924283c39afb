"""Bulk decodes change nothing: both paths give the same bytes.

`simulate(..., bulk_decodes=False)` runs every step through the scheduler's per-request path.
Each case runs both ways and compares the result JSON and the per-request and per-step Parquet
files byte for byte; the engine-level property test also compares the token gaps, the
requests' final state and the KV cache's block order after random small runs.
"""

from __future__ import annotations

import io
import math

import pyarrow.parquet as pq
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.waste import WasteAverager
from pagesim.metrics import MetricsCollector
from pagesim.request import Request
from pagesim.scheduler.output import synthetic_token, synthetic_tokens
from pagesim.scheduler.scheduler import Scheduler
from pagesim.sim.build import default_profile
from pagesim.sim.bulk.decodes import BulkDecodes
from pagesim.sim.cluster import simulate_cluster
from pagesim.sim.deferred_hashes import DeferredHashTable
from pagesim.sim.engine import ServingEngine
from pagesim.sim.output import requests_table, result_json, steps_table
from pagesim.sim.probe import WasteProbe
from pagesim.sim.runner import CostModelRunner
from pagesim.sim.simulate import LoadSpec, simulate

PRESSURE = dict(num_gpu_blocks_override=300)
CHAT = dict(workload="chat", num_prompts=80, request_rate=20.0)

CASES: dict[str, tuple[dict, dict]] = {
    "chat": ({}, CHAT),
    "recompute-pressure": (PRESSURE, dict(CHAT, request_rate=40.0)),
    "swap-pressure": (dict(PRESSURE, preemption_mode="swap"), dict(CHAT, request_rate=40.0)),
    "system-prompt": ({}, dict(workload="system-prompt", num_prompts=80, request_rate=20.0)),
    "multi-turn": ({}, dict(workload="multi-turn", num_prompts=60)),
    "mooncake-conversation": (
        {},
        dict(workload="mooncake-conversation", num_prompts=60, request_rate=10.0),
    ),
    "random-prefix": (
        {},
        dict(
            workload="random",
            num_prompts=60,
            request_rate=math.inf,
            random_input_len=300,
            random_output_len=60,
            random_prefix_len=100,
            random_range_ratio=0.5,
        ),
    ),
    "priority-pressure": (
        dict(PRESSURE, scheduling_policy="priority"),
        dict(CHAT, request_rate=40.0),
    ),
    "no-chunked-prefill": (dict(enable_chunked_prefill=False), dict(CHAT, request_rate=40.0)),
    "small-budget": (dict(max_num_batched_tokens=256, max_num_seqs=24), CHAT),
    "vllm-0.23-threshold": (
        dict(vllm_compat="0.23", max_num_partial_prefills=2, max_num_batched_tokens=2048),
        CHAT,
    ),
    "max-concurrency": ({}, dict(CHAT, max_concurrency=6)),
    "rate-inf": ({}, dict(CHAT, request_rate=math.inf)),
    "no-prefix-caching": (dict(enable_prefix_caching=False), CHAT),
    "sliding-window": (dict(model="mistral-7b"), CHAT),
    "block-size-8": (dict(PRESSURE, block_size=8, num_gpu_blocks_override=600), CHAT),
    "block-size-64": (dict(block_size=64), CHAT),
    "reserve-max": (dict(allocator="reserve-max"), CHAT),
    "pow2": (dict(allocator="pow2"), CHAT),
    "oracle": (dict(allocator="oracle"), CHAT),
    "pow2-first-fit": (dict(allocator="pow2", contiguous_placement="first-fit"), CHAT),
}


def _parquet(table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=False)
    return buf.getvalue()


def _outputs(metrics, result: dict) -> tuple[str, bytes, bytes, bytes]:
    return (
        result_json(result, {}, date="x"),
        _parquet(requests_table(metrics)),
        _parquet(steps_table(metrics)),
        metrics.itl_s.tobytes(),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_simulate_bulk_equals_per_request(name: str) -> None:
    engine, load = CASES[name]
    config = EngineConfig.create(**engine)
    # The invariant checker walks every block after each KV operation: one small case only.
    check = name == "recompute-pressure"
    bulk = simulate(config, LoadSpec(**load), bulk_decodes=True, check_invariants=check)
    slow = simulate(config, LoadSpec(**load), bulk_decodes=False)
    assert bulk.result["completed"] > 0
    for a, b in zip(
        _outputs(bulk.metrics, bulk.result), _outputs(slow.metrics, slow.result), strict=True
    ):
        assert a == b


def test_calibrated_cost_model_bulk_equals_per_request() -> None:
    """The shipped calibration profile's cost model sees the same batch shapes."""
    config = EngineConfig.create(model="llama-2-7b", gpu="h200")
    profile = default_profile(config)
    if profile is None:
        pytest.skip("no shipped llama-2-7b/h200 calibration profile")
    runs = [
        simulate(config, LoadSpec(**CHAT), profile=profile, bulk_decodes=flag)
        for flag in (True, False)
    ]
    assert _outputs(runs[0].metrics, runs[0].result) == _outputs(runs[1].metrics, runs[1].result)


def test_cluster_bulk_equals_per_request() -> None:
    from pagesim.planning.router import make_router

    config = EngineConfig.create()
    load = LoadSpec(workload="system-prompt", num_prompts=80, request_rate=30.0)
    runs = [
        simulate_cluster(config, load, 2, make_router("prefix-aware"), bulk_decodes=flag)
        for flag in (True, False)
    ]
    assert runs[0].replicas == runs[1].replicas
    assert result_json(runs[0].result, {}, date="x") == result_json(runs[1].result, {}, date="x")
    for a, b in zip(runs[0].metrics, runs[1].metrics, strict=True):
        assert _outputs(a, {}) == _outputs(b, {})


def test_bulk_decodes_engage_on_chat() -> None:
    """Bulk decodes really take part (the equality tests would pass if it never were)."""
    seen: list[int] = []
    import pagesim.sim.bulk.decodes as fp

    original = fp.BulkDecodes.end_step

    def spy(self, now):
        seen.append(len(self.members))
        return original(self, now)

    fp.BulkDecodes.end_step = spy  # type: ignore[method-assign]
    try:
        simulate(EngineConfig.create(), LoadSpec(**CHAT))
    finally:
        fp.BulkDecodes.end_step = original  # type: ignore[method-assign]
    assert len(seen) > 100 and max(seen) > 10


def test_synthetic_tokens_match_one_by_one() -> None:
    r = Request("x", [5, 17, 31999, 4], max_tokens=3)
    assert synthetic_tokens(r, 3, 40, 32000) == [synthetic_token(r, i, 32000) for i in range(3, 40)]
    assert synthetic_tokens(r, 7, 7) == []


# ---- engine level: random small runs --------------------------------------------------------
class _Linear:
    """Dyadic step costs: every simulated time is exact, ties between events are common. It
    reads the per-entry decode contexts too (bulk decodes give them as a view)."""

    def step_time(self, batch: BatchShape) -> float:
        contexts = batch.decode_context_tokens
        assert len(contexts) == batch.num_decode_seqs
        assert sum(contexts) == batch.decode_context_sum
        spread = (max(contexts) - contexts[0]) % 5 if contexts else 0
        return (64 + batch.total_tokens + batch.decode_context_sum % 7 + spread) * 2.0**-10


def _run(
    bulk: bool,
    cfg: EngineConfig,
    allocator: str,
    num_blocks: int,
    requests: list[tuple[float, int, int, int]],
    deferred: bool = False,
):
    if allocator == "paged":
        kv = KVCacheManager(
            num_gpu_blocks=num_blocks,
            block_size=cfg.block_size,
            enable_caching=cfg.enable_prefix_caching,
            vllm_compat=cfg.vllm_compat,
            deferred_hashes=DeferredHashTable if deferred else None,
        )
    else:
        kv = ContiguousKVCacheManager(
            num_gpu_blocks=num_blocks,
            block_size=cfg.block_size,
            policy=allocator,
            max_model_len=cfg.max_model_len,
        )
    scheduler = Scheduler(cfg, kv, page_size_bytes=4096)
    env = simpy.Environment()
    metrics = MetricsCollector()
    averager = WasteAverager()
    probe = WasteProbe(scheduler, kv, averager, env)
    runner = CostModelRunner(_Linear(), vocab_size=1000)
    path = BulkDecodes(scheduler, runner, metrics.records, paged=allocator == "paged")
    engine = ServingEngine(
        env, scheduler, runner, metrics, probe, bulk_decodes=path if bulk else None
    )
    made: list[Request] = []
    for i, (at, prompt_len, max_tokens, family) in enumerate(requests):
        prompt = [(family * 37 + j) % 1000 for j in range(prompt_len)]  # shared prefixes
        request = Request(f"r{i}", prompt, max_tokens, priority=i % 3)
        made.append(request)

        def arrive(request=request, at=at):
            yield env.timeout(at)
            engine.add_request(request)

        env.process(arrive())
    env.run()
    state = [
        (
            r.request_id,
            r.status,
            r.num_computed_tokens,
            list(r.output_token_ids),
            list(r.block_hashes),
            r.num_preemptions,
        )
        for r in made
    ]
    records = [tuple(getattr(rec, f) for f in rec.__slots__) for rec in metrics.records.values()]
    steps = {k: v.tobytes() for k, v in metrics.steps.items()}
    blocks = None
    if allocator == "paged":
        table = kv.deferred_hashes
        queue = kv.block_pool.free_block_queue
        order, block = [], queue.fake_free_list_head.next_free_block
        while block is not queue.fake_free_list_tail:  # hashes in free-queue order, eager values
            order.append((block.block_id, table.hash_of(block) if table else block.block_hash))
            block = block.next_free_block
        if table is not None:
            table.materialize_all()
        blocks = (order, list(kv.block_pool.cached_block_hash_to_block))
    return (
        state,
        records,
        steps,
        metrics.itl_s.tobytes(),
        metrics.token_times_s.tobytes(),
        metrics.token_counts.tobytes(),
        scheduler.stats,
        averager.mean(),
        blocks,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_blocks=st.integers(12, 200),
    budget=st.integers(16, 96),
    max_num_seqs=st.integers(1, 12),
    caching=st.booleans(),
    mode=st.sampled_from(["recompute", "swap"]),
    policy=st.sampled_from(["fcfs", "priority"]),
    compat=st.sampled_from(["0.33", "0.23"]),
    allocator=st.sampled_from(["paged", "paged", "pow2", "oracle"]),
    threshold=st.sampled_from([0, 0, 8, 32]),
    reserve_full_isl=st.booleans(),
    chunked=st.sampled_from([True, True, False]),
    requests=st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.03, 0.1, 0.25, 0.6]),
            st.integers(1, 70),
            st.integers(1, 40),
            st.integers(0, 2),
        ),
        min_size=1,
        max_size=14,
    ),
)
def test_engine_bulk_equals_per_request(
    block_size,
    num_blocks,
    budget,
    max_num_seqs,
    caching,
    mode,
    policy,
    compat,
    allocator,
    threshold,
    reserve_full_isl,
    chunked,
    requests,
) -> None:
    cfg = EngineConfig(
        block_size=block_size,
        max_num_batched_tokens=budget if chunked else budget + 128,
        max_num_seqs=max_num_seqs,
        max_model_len=128,
        enable_prefix_caching=caching and allocator == "paged",
        preemption_mode=mode,
        scheduling_policy=policy,
        vllm_compat=compat,
        swap_space=0.0001,
        long_prefill_token_threshold=threshold,
        scheduler_reserve_full_isl=reserve_full_isl,
        enable_chunked_prefill=chunked,
    )
    num_blocks = max(num_blocks, -(-128 // block_size) + 2)  # any one request fits
    slow = _run(False, cfg, allocator, num_blocks, requests)
    assert _run(True, cfg, allocator, num_blocks, requests) == slow
    if allocator == "paged" and caching:  # deferred hashes (the simulator's): the same run
        deferred = _run(True, cfg, allocator, num_blocks, requests, deferred=True)
        assert deferred == _run(False, cfg, allocator, num_blocks, requests, deferred=True)
        assert _without_hash_order(deferred) == _without_hash_order(slow)
        for deferred_req, eager_req in zip(deferred[0], slow[0], strict=True):
            assert deferred_req[4] == eager_req[4][: len(deferred_req[4])]


def _without_hash_order(run: tuple) -> tuple:
    """A run's state, less what deferred hashes may leave different: how far each request's
    hashes reach (a prefix of the eager list, checked apart) and the hash map's key order."""
    state, *rest, (order, keys) = run
    state = [(*s[:4], *s[5:]) for s in state]
    return (state, *rest, (order, sorted(keys)))


@pytest.mark.parametrize("vocab", [32000, 128256, 7, 2, 1])
def test_synthetic_token_table_windows(vocab: int) -> None:
    """The bulk decodes' table gives `synthetic_tokens` as slices, and their int32 packing."""
    import struct

    from pagesim.scheduler.output import SyntheticTokenTable

    table = SyntheticTokenTable(vocab)
    assert table.usable
    for prompt in ([5, 17, 31999, 4], [0], [], list(range(40))):
        r = Request("x", [t % vocab for t in prompt], max_tokens=3)
        start = table.start(r)
        for first, stop in ((0, 1), (3, 40), (7, 7), (100, 100 + 3 * vocab + 5)):
            assert table.tokens(start, first, stop) == synthetic_tokens(r, first, stop, vocab)
        count = min(16, vocab)
        assert table.packed(start, 9, count) == struct.pack(
            f"<{count}i", *synthetic_tokens(r, 9, 9 + count, vocab)
        )
        assert table.packed(start, 9, vocab + 1) is None
    assert not SyntheticTokenTable(2 * 104_729).usable  # stride not invertible: no table


def test_filled_blocks_join_later(monkeypatch) -> None:
    """With deferred hashes the filled decode blocks join in bulk, not one event per block (the
    equality tests would pass if they never did)."""
    calls = {"one": 0, "bulk": 0}
    one, bulk = KVCacheManager.cache_decode_block, KVCacheManager.cache_decode_blocks

    def count_one(self, *args):
        calls["one"] += 1
        return one(self, *args)

    def count_bulk(self, *args):
        calls["bulk"] += 1
        return bulk(self, *args)

    monkeypatch.setattr(KVCacheManager, "cache_decode_block", count_one)
    monkeypatch.setattr(KVCacheManager, "cache_decode_blocks", count_bulk)
    simulate(EngineConfig.create(), LoadSpec(**CHAT))
    assert calls["one"] == 0 and calls["bulk"] > 0
