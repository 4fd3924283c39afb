"""Several replicas behind a router, in one SimPy environment.

    clients (as in `simulate`) --add_request--> _Frontend --router.choose--> ServingEngine i
    each engine: its own scheduler, KV cache and metrics; one clock for all

The router is any object with `choose(request, engines) -> index` (see
`pagesim.planning.router`); it is called once per request, at its arrival, and sees the
engines' live state (queues, KV caches). With one replica and any router the result equals
`simulate`'s exactly: the same clients, engine and summary code run.

`cost_model` replaces the cost model built from the config (and `profile`), e.g. a model of a
GPU with another host-link bandwidth; every replica shares it (cost models are pure).
"""

from __future__ import annotations

import dataclasses
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import simpy

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import ConfigError, InternalError
from pagesim.kvcache.waste import WasteAverager
from pagesim.metrics import MetricsCollector, summarize
from pagesim.metrics.report import MEAN_KEYS, PEAK_KEYS, SUMMED_KEYS
from pagesim.request import Request
from pagesim.sim.build import build_cost_model, build_scheduler
from pagesim.sim.bulk.decodes import BulkDecodes
from pagesim.sim.engine import ServingEngine
from pagesim.sim.runner import CostModelRunner, shared_blocks_counter
from pagesim.sim.simulate import (
    LoadSpec,
    ProgressHook,
    _Clients,
    _kv_probe,
    _pagesim_keys,
    sample_traffic,
)


class Router(Protocol):
    """Picks the replica for a request at its arrival."""

    name: str

    def choose(self, request: Request, engines: list[ServingEngine]) -> int: ...


@dataclass
class ClusterResult:
    """A finished multi-replica run: the cluster-wide summary and each replica's."""

    result: dict[str, Any]  # vllm bench keys over all requests + aggregated pagesim keys
    replicas: list[dict[str, Any]]  # per replica: pagesim keys + num_requests
    metrics: list[MetricsCollector]  # per replica
    config: EngineConfig
    load: LoadSpec
    extra: dict[str, Any] = field(default_factory=dict)


class _Frontend:
    """What the clients see: one `add_request` and one `on_finish` list over N engines."""

    def __init__(self, engines: list[ServingEngine], router: Router) -> None:
        self.engines, self.router = engines, router
        self.on_finish: list = []
        self.num_routed = [0] * len(engines)
        for engine in engines:
            engine.on_finish.append(self._finished)

    def add_request(self, request: Request) -> None:
        i = self.router.choose(request, self.engines)
        if not 0 <= i < len(self.engines):
            raise InternalError(
                f"router {self.router.name!r} chose replica {i} of {len(self.engines)}"
            )
        self.num_routed[i] += 1
        self.engines[i].add_request(request)

    def _finished(self, request: Request) -> None:
        for callback in self.on_finish:
            callback(request)


def simulate_cluster(
    config: EngineConfig,
    load: LoadSpec,
    num_replicas: int,
    router: Router,
    *,
    profile: str | Path | None = None,
    cost_model: CostModel | None = None,
    progress: ProgressHook | None = None,
    bulk_decodes: bool = True,
) -> ClusterResult:
    """Run `load` against `num_replicas` replicas of `config` behind `router`.

    `bulk_decodes=False` keeps every step on the per-request path (same results)."""
    if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
        raise ConfigError(f"num_replicas={num_replicas!r}: must be an integer >= 1")
    model = config.model_spec
    plan, arrivals = sample_traffic(load, model.vocab_size)
    cost = cost_model if cost_model is not None else build_cost_model(config, profile)

    env = simpy.Environment()
    engines, parts = [], []
    for _ in range(num_replicas):
        scheduler = build_scheduler(config)
        metrics, averager = MetricsCollector(), WasteAverager()
        probe = _kv_probe(scheduler, scheduler.kv_cache_manager, averager, env)
        runner = CostModelRunner(
            cost,
            vocab_size=model.vocab_size,
            shared_block_refs=shared_blocks_counter(cost, scheduler),
        )
        bulk = (
            BulkDecodes.for_config(config, scheduler, runner, metrics.records)
            if bulk_decodes
            else None
        )
        engines.append(ServingEngine(env, scheduler, runner, metrics, probe, bulk_decodes=bulk))
        parts.append((scheduler, metrics, averager))
    frontend = _Frontend(engines, router)
    clients = _Clients(env, frontend, plan, arrivals, load.max_concurrency, progress)
    env.run()

    total = clients.num_sent
    if sum(len(m.records) for _, m, _ in parts) != total or not clients.all_done:
        raise InternalError(
            f"simulation ended with {total - clients.num_done} of {total} requests unfinished"
        )
    replicas = []
    for i, (scheduler, metrics, averager) in enumerate(parts):
        keys = _pagesim_keys(config, scheduler, metrics, averager)
        keys.pop("engine_config")
        keys["num_requests"] = frontend.num_routed[i]
        replicas.append(keys)
    merged = merge_metrics([m for _, m, _ in parts])
    result = summarize(
        merged, percentiles=load.percentiles, goodput_slos_ms=dict(load.goodput_slos_ms) or None
    )
    result.update(aggregate_replica_keys(replicas))
    result["engine_config"] = dataclasses.asdict(config)
    result["num_replicas"] = num_replicas
    result["router"] = router.name
    return ClusterResult(
        result=result, replicas=replicas, metrics=[m for _, m, _ in parts], config=config, load=load
    )


def merge_metrics(collectors: list[MetricsCollector]) -> MetricsCollector:
    """One collector holding every replica's requests, token gaps, token times and steps.

    Records keep replica order; token times are merged in time order (stable), as one
    benchmark client would have seen them; steps are concatenated (they are per replica).
    """
    if len(collectors) == 1:
        return collectors[0]
    merged = MetricsCollector()
    for c in collectors:
        merged.extend_steps(c)
    for f in dataclasses.fields(MetricsCollector):
        if f.name in ("step_values", "step_spill"):  # done above
            continue
        values = [getattr(c, f.name) for c in collectors]
        if isinstance(values[0], dict) and f.name == "records":
            out: Any = {}
            for v in values:
                out.update(v)
        elif isinstance(values[0], dict):
            out = {
                k: array(col.typecode, b"".join(v[k].tobytes() for v in values))
                for k, col in values[0].items()
            }
        elif isinstance(values[0], array):
            out = array(values[0].typecode, b"".join(v.tobytes() for v in values))
        else:
            raise InternalError(
                f"merge_metrics: field {f.name!r} of MetricsCollector has no merge rule"
            )
        setattr(merged, f.name, out)
    times = np.frombuffer(merged.token_times_s, dtype=np.float64)
    order = np.argsort(times, kind="stable")
    counts = np.frombuffer(merged.token_counts, dtype=np.int64)
    merged.token_times_s = array("d", times[order].tobytes())
    merged.token_counts = array(merged.token_counts.typecode, counts[order].tobytes())
    return merged


def aggregate_replica_keys(replicas: list[dict[str, Any]]) -> dict[str, Any]:
    """Cluster-wide pagesim keys: counters summed, peaks maxed, per-replica fractions averaged
    (replicas have equal KV memory), the prefix hit rate recomputed from the summed tokens."""
    out: dict[str, Any] = {}
    for key in replicas[0]:
        values = [r[key] for r in replicas]
        if key in SUMMED_KEYS:
            out[key] = sum(values)
        elif key in PEAK_KEYS:
            out[key] = max(values)
        elif key in MEAN_KEYS:
            out[key] = sum(values) / len(values)
        elif key == "rejected_reasons":
            reasons: dict[str, int] = {}
            for v in values:
                for reason, n in v.items():
                    reasons[reason] = reasons.get(reason, 0) + n
            out[key] = dict(sorted(reasons.items()))
        elif key == "num_requests":
            continue
        else:  # same on every replica (num_gpu_blocks) or new: take replica 0's
            out[key] = values[0]
    query = out.get("prefix_cache_query_tokens", 0)
    if "prefix_cache_hit_rate" in out:
        out["prefix_cache_hit_rate"] = out["prefix_cache_hit_tokens"] / query if query else 0.0
    out["replica_num_requests"] = [r["num_requests"] for r in replicas]
    out["replica_prefix_cache_hit_rate"] = [r.get("prefix_cache_hit_rate", 0.0) for r in replicas]
    return out


def simulate_requests(
    config: EngineConfig,
    requests: list[Request],
    *,
    profile: str | Path | None = None,
    cost_model: CostModel | None = None,
) -> MetricsCollector:
    """Serve explicit requests, each sent at its `arrival_time`, on one engine; return their
    records. For staged scenarios that no workload describes (a probe after a victim)."""
    env = simpy.Environment()
    scheduler = build_scheduler(config)
    cost = cost_model if cost_model is not None else build_cost_model(config, profile)
    metrics = MetricsCollector()
    probe = _kv_probe(scheduler, scheduler.kv_cache_manager, WasteAverager(), env)
    runner = CostModelRunner(
        cost, config.model_spec.vocab_size, shared_block_refs=shared_blocks_counter(cost, scheduler)
    )
    bulk = BulkDecodes.for_config(config, scheduler, runner, metrics.records)
    engine = ServingEngine(env, scheduler, runner, metrics, probe, bulk_decodes=bulk)

    def send(request: Request):
        yield env.timeout(request.arrival_time)
        engine.add_request(request)

    for request in requests:
        env.process(send(request))
    env.run()
    return metrics
