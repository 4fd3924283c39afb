"""Capacity plans on a small load: max rate, replicas, KV sizing."""

from __future__ import annotations

import pytest

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.kvcache.sizing import kv_capacity
from pagesim.planning.capacity import max_sustainable_rate, plan_load, replicas_for_rate
from pagesim.planning.kv_sizing import min_kv_memory, utilization_for_blocks
from pagesim.planning.slo import parse_slos
from pagesim.sim.simulate import LoadSpec, simulate

LOAD = LoadSpec(workload="random", num_prompts=60, random_input_len=512, random_output_len=64)
CONFIG = EngineConfig.create(max_num_seqs=16, max_num_batched_tokens=2048)
SLOS = parse_slos(["p99_ttft_ms<=400"])
KW = {"min_duration_s": 5.0, "rel_tol": 0.05}


@pytest.fixture(scope="module")
def capacity():
    return max_sustainable_rate(CONFIG, LOAD, SLOS, **KW)


def test_max_rate_is_bracketed_and_deterministic(capacity) -> None:
    c = capacity
    assert c.max_rate is not None and c.first_failing_rate is not None
    assert c.max_rate < c.first_failing_rate <= c.max_rate / (1 - 0.05) + 1e-9
    by_rate = {p.value: p for p in c.probes}
    assert by_rate[c.max_rate].passed and not by_rate[c.first_failing_rate].passed
    assert c.result["p99_ttft_ms"] <= 400
    # An independent run at the found rate gives the reported metrics.
    again = simulate(CONFIG, plan_load(LOAD, SLOS, c.max_rate, min_duration_s=5.0)).result
    assert again["p99_ttft_ms"] == c.result["p99_ttft_ms"]
    assert max_sustainable_rate(CONFIG, LOAD, SLOS, **KW).probes == c.probes


def test_probe_sends_enough_requests() -> None:
    load = plan_load(LOAD, SLOS, 10.0, min_duration_s=20.0)
    assert load.num_prompts == 200 and load.request_rate == 10.0
    assert plan_load(LOAD, parse_slos(["p95_ttft_ms<=1"]), 1.0).percentiles == (95, 99)


def test_replicas_for_a_target_rate(capacity) -> None:
    target = 2.5 * capacity.max_rate
    plan = replicas_for_rate(CONFIG, LOAD, SLOS, target, per_replica=capacity, **KW)
    assert plan.estimate == 3
    tried = {int(p.value): p.passed for p in plan.probes}
    n = plan.num_replicas
    assert n is not None and tried[n] and (n == 1 or tried[n - 1] is False)
    assert plan.result["num_replicas"] == n and plan.result["router"] == "round-robin"


def test_kv_sizing_finds_the_smallest_passing_cache() -> None:
    config = EngineConfig.create(max_model_len=1024)
    slos = parse_slos(["p99_ttft_ms<=1000"])
    k = min_kv_memory(config, LOAD, slos, 20.0, **KW)
    assert k.num_gpu_blocks is not None and k.num_gpu_blocks < k.max_num_gpu_blocks
    assert k.result is not None
    failed = [int(p.value) for p in k.probes if not p.passed]
    assert failed and max(failed) < k.num_gpu_blocks
    assert max(failed) >= k.num_gpu_blocks * (1 - 0.05) - 1
    assert k.kv_cache_memory_bytes == k.num_gpu_blocks * kv_capacity(config).page_size_bytes
    util = k.gpu_memory_utilization
    assert (
        kv_capacity(config.replace(gpu_memory_utilization=util)).num_gpu_blocks >= k.num_gpu_blocks
    )
    assert (
        kv_capacity(config.replace(gpu_memory_utilization=round(util - 0.001, 3))).num_gpu_blocks
        < k.num_gpu_blocks
    )
    assert utilization_for_blocks(config, 10**9) is None


def test_plan_input_errors() -> None:
    with pytest.raises(ConfigError, match="at least one objective"):
        max_sustainable_rate(CONFIG, LOAD, parse_slos([]))
    with pytest.raises(ConfigError, match="--target-rate"):
        replicas_for_rate(CONFIG, LOAD, SLOS, 0.0)
    with pytest.raises(ConfigError, match="num_gpu_blocks_override"):
        min_kv_memory(CONFIG.replace(num_gpu_blocks_override=100), LOAD, SLOS, 1.0)
