"""Several replicas behind a router: one replica equals `simulate`; routing policies."""

from __future__ import annotations

import pytest

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError, UnknownNameError
from pagesim.planning.router import make_router
from pagesim.sim.cluster import simulate_cluster
from pagesim.sim.simulate import LoadSpec, simulate

SYSTEM = LoadSpec(workload="system-prompt", num_prompts=80, request_rate=16.0, seed=3)


def test_one_replica_is_simulate_exactly() -> None:
    config = EngineConfig.create(num_gpu_blocks_override=600)
    alone = simulate(config, SYSTEM).result
    for router in ("round-robin", "least-loaded", "prefix-aware"):
        cluster = simulate_cluster(config, SYSTEM, 1, make_router(router)).result
        assert {k: cluster[k] for k in alone} == alone
        assert cluster["num_replicas"] == 1 and cluster["replica_num_requests"] == [80]


def test_round_robin_splits_evenly_and_is_deterministic() -> None:
    config = EngineConfig.create()
    a = simulate_cluster(config, SYSTEM, 4, make_router("round-robin"))
    assert a.result["replica_num_requests"] == [20, 20, 20, 20]
    assert a.result["completed"] == 80
    assert sum(r["num_requests"] for r in a.replicas) == 80
    b = simulate_cluster(config, SYSTEM, 4, make_router("round-robin"))
    assert a.result == b.result


def test_prefix_aware_keeps_prefixes_together() -> None:
    config = EngineConfig.create()
    rr = simulate_cluster(config, SYSTEM, 4, make_router("round-robin")).result
    pa = simulate_cluster(config, SYSTEM, 4, make_router("prefix-aware")).result
    assert pa["prefix_cache_hit_rate"] > rr["prefix_cache_hit_rate"] + 0.05
    assert pa["completed"] == rr["completed"] == 80
    # the cluster's hit rate is recomputed from the replicas' summed tokens
    assert pa["prefix_cache_hit_rate"] == pytest.approx(
        pa["prefix_cache_hit_tokens"] / pa["prefix_cache_query_tokens"]
    )


def test_least_loaded_avoids_the_busy_replica() -> None:
    class Counting:
        name = "counting"

        def __init__(self) -> None:
            self.inner = make_router("least-loaded")
            self.loads: list[list[int]] = []

        def choose(self, request, engines):
            loads = [sum(e.scheduler.get_request_counts()) for e in engines]
            i = self.inner.choose(request, engines)
            self.loads.append((loads, i))
            return i

    router = Counting()
    res = simulate_cluster(EngineConfig.create(), SYSTEM, 3, router)
    assert res.result["completed"] == 80 and len(router.loads) == 80
    for loads, i in router.loads:  # every pick had the least load at that moment
        assert loads[i] == min(loads)
    assert len({i for _, i in router.loads}) == 3


def test_bad_router_and_replica_count() -> None:
    with pytest.raises(UnknownNameError, match="unknown router 'random'"):
        make_router("random")
    with pytest.raises(ConfigError, match="num_replicas=0"):
        simulate_cluster(EngineConfig.create(), SYSTEM, 0, make_router("round-robin"))
