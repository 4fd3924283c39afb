"""Capacity plans: the highest request rate one replica sustains within SLOs, and the
number of replicas (behind a router) a target rate needs.

Max rate: one saturated run (`request_rate=inf`) measures the replica's request throughput
T; the search starts at T/2, brackets by doubling or halving up to 2T (no steady state can
serve more than the engine does with every request queued; the factor covers the drain tail
of a finite run) and bisects to `rel_tol` (`search.search_max`). A rate passes when every
objective of the `SLOSpec` holds for a run of `load` at that rate; the load's seed is kept, so
a plan is deterministic.

A probe must reach steady state: a burst of 100 requests at 100 req/s meets most SLOs on an
engine that could never sustain that rate, since its queue has no time to grow. So a probe at
rate R sends max(num_prompts, R * min_duration_s) requests: arrivals span at least
`min_duration_s` (60 s by default, several end-to-end latencies of a chat request).

Replicas: the per-replica capacity gives an estimate ceil(target / capacity); the estimate is
then checked by simulating that many replicas behind the router at the target rate (each
replica gets `load.num_prompts` requests on average), and moved down while fewer replicas
still pass, or up until enough do. The check matters because routing changes the answer:
round-robin spreads a shared prefix over every replica's cache, a prefix-aware router keeps
it on one.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import ConfigError
from pagesim.metrics.report import rejection_line
from pagesim.planning.router import make_router
from pagesim.planning.search import search_max
from pagesim.planning.slo import SLOSpec
from pagesim.sim.cluster import simulate_cluster
from pagesim.sim.simulate import LoadSpec, simulate


@dataclass(frozen=True)
class SearchPoint:
    """One simulated point of a search (the plan's "probes"; not a KV probe)."""

    value: float  # request rate (req/s), replica count or KV bytes, as the search says
    passed: bool
    violations: tuple[str, ...]
    result: dict[str, Any]


@dataclass(frozen=True)
class CapacityResult:
    """`max_rate` (req/s) passed; `first_failing_rate` is the closest rate that failed.

    max_rate None: even `min_rate` failed. first_failing_rate None: the ceiling passed.
    """

    max_rate: float | None
    first_failing_rate: float | None
    result: dict[str, Any] | None  # the run at max_rate
    saturated_throughput: float  # req/s with every request sent at t=0
    probes: tuple[SearchPoint, ...]  # rate probes in the order run
    slos: SLOSpec
    # why no rate was searched (the saturated run rejected requests, which no rate can
    # change, and `slos` does not allow it); None: the search ran
    refused: str | None = None


@dataclass(frozen=True)
class ReplicaPlan:
    """Replicas for `target_rate` behind `router`; num_replicas None: `max_replicas` failed."""

    target_rate: float
    router: str
    per_replica: CapacityResult
    estimate: int | None  # ceil(target / per-replica capacity)
    num_replicas: int | None
    result: dict[str, Any] | None  # the cluster run at num_replicas
    probes: tuple[SearchPoint, ...]  # one per replica count tried


DEFAULT_MIN_DURATION_S = 60.0


def plan_load(
    load: LoadSpec,
    slos: SLOSpec,
    rate: float,
    *,
    num_prompts: int | None = None,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
) -> LoadSpec:
    """`load` at `rate` req/s, with enough requests for `min_duration_s` of arrivals and the
    percentiles and goodput thresholds that `slos` needs."""
    n = num_prompts or load.num_prompts
    if not math.isinf(rate):
        n = max(n, math.ceil(rate * min_duration_s))
    return dataclasses.replace(
        load,
        request_rate=rate,
        num_prompts=n,
        percentiles=slos.percentiles(load.percentiles),
        goodput_slos_ms=slos.goodput_ms or load.goodput_slos_ms,
    )


def _search_point(value: float, slos: SLOSpec, result: dict[str, Any]) -> SearchPoint:
    passed, violations = slos.check(result)
    return SearchPoint(value, passed, violations, result)


def max_sustainable_rate(
    config: EngineConfig,
    load: LoadSpec,
    slos: SLOSpec,
    *,
    profile: str | Path | None = None,
    rel_tol: float = 0.025,
    min_rate: float = 0.01,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
    cost_model: CostModel | None = None,
    near: float | None = None,
) -> CapacityResult:
    """Highest request rate (req/s) at which one replica meets `slos` on `load`
    (`cost_model`: prices the steps in place of `profile`'s model; `near`: a rate the answer
    is expected close to, searched from in steps of 10 % instead of from half the saturated
    throughput in steps of 2)."""
    if slos.empty:
        raise ConfigError("--slo: give at least one objective, e.g. p99_ttft_ms<=500")
    saturated = simulate(
        config, plan_load(load, slos, math.inf), profile=profile, cost_model=cost_model
    )
    throughput = float(saturated.result["request_throughput"])
    if saturated.result.get("num_rejected") and not slos.allow_rejected:
        why = f"{rejection_line(saturated.result)}; --allow-rejected plans for the rest"
        return CapacityResult(None, None, None, throughput, (), slos, why)
    ceiling = max(2.0 * throughput, min_rate)
    guess = 0.5 * throughput if near is None else near
    start = min(max(guess, min_rate), ceiling)
    probes: list[SearchPoint] = []

    def passes(rate: float) -> bool:
        run = simulate(
            config,
            plan_load(load, slos, rate, min_duration_s=min_duration_s),
            profile=profile,
            cost_model=cost_model,
        )
        probes.append(_search_point(rate, slos, run.result))
        return probes[-1].passed

    b = search_max(passes, start, min_rate, ceiling, rel_tol, step=2.0 if near is None else 1.1)
    at = next((p.result for p in probes if p.value == b.best), None)
    return CapacityResult(b.best, b.failed, at, throughput, tuple(probes), slos)


def replicas_for_rate(
    config: EngineConfig,
    load: LoadSpec,
    slos: SLOSpec,
    target_rate: float,
    *,
    router: str = "round-robin",
    profile: str | Path | None = None,
    per_replica: CapacityResult | None = None,
    max_replicas: int = 64,
    rel_tol: float = 0.025,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
    cost_model: CostModel | None = None,
) -> ReplicaPlan:
    """Fewest replicas of `config` behind `router` that meet `slos` at `target_rate` req/s."""
    if not target_rate > 0 or math.isinf(target_rate):
        raise ConfigError(f"--target-rate {target_rate!r}: must be a finite rate > 0")
    make_router(router)  # an unknown name fails before any simulation
    cap = per_replica or max_sustainable_rate(
        config,
        load,
        slos,
        profile=profile,
        rel_tol=rel_tol,
        min_duration_s=min_duration_s,
        cost_model=cost_model,
    )
    estimate = math.ceil(target_rate / cap.max_rate - 1e-9) if cap.max_rate else None
    tried: dict[int, SearchPoint] = {}

    def check(n: int) -> bool:
        if n not in tried:
            cluster_load = plan_load(
                load,
                slos,
                target_rate,
                num_prompts=load.num_prompts * n,
                min_duration_s=min_duration_s,
            )
            run = simulate_cluster(
                config, cluster_load, n, make_router(router), profile=profile, cost_model=cost_model
            )
            tried[n] = _search_point(n, slos, run.result)
        return tried[n].passed

    n = min(max(estimate or 1, 1), max_replicas)
    found: int | None = n
    if check(n):
        while n > 1 and check(n - 1):
            n -= 1
        found = n
    else:
        while n < max_replicas and not check(n + 1):
            n += 1
        found = n + 1 if n < max_replicas else None
    result = tried[found].result if found is not None else None
    return ReplicaPlan(target_rate, router, cap, estimate, found, result, tuple(tried.values()))
