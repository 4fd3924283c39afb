"""One simulation: a workload's traffic against one replica, summarised as `vllm bench` does.

plan = workload.sample(num_prompts, seed)      sessions, lengths, arrival times
clients (SimPy processes) --add_request--> ServingEngine --steps--> MetricsCollector
summarize(metrics) + KV and scheduler counters -> result dict (vllm bench's JSON keys)
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import simpy

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import InternalError
from pagesim.kvcache.invariants import check_kv_cache_manager
from pagesim.kvcache.waste import WasteAverager
from pagesim.metrics import MetricsCollector, summarize
from pagesim.metrics.report import engine_keys
from pagesim.request import Request
from pagesim.sim.build import build_cost_model, build_scheduler
from pagesim.sim.bulk.decodes import BulkDecodes
from pagesim.sim.engine import ServingEngine
from pagesim.sim.load import LoadSpec, sample_traffic
from pagesim.sim.probe import WasteProbe
from pagesim.sim.runner import CostModelRunner, shared_blocks_counter
from pagesim.workload.sessions import Session


@dataclass
class SimulationResult:
    """A finished run: the summary JSON plus the raw records behind it."""

    result: dict[str, Any]  # vllm bench keys + pagesim's own
    metrics: MetricsCollector
    config: EngineConfig
    load: LoadSpec


ProgressHook = Callable[[int, int], None]  # (requests done, total)


def simulate(
    config: EngineConfig,
    load: LoadSpec,
    *,
    profile: str | Path | None = None,
    check_invariants: bool = False,
    progress: ProgressHook | None = None,
    bulk_decodes: bool = True,
    cost_model: CostModel | None = None,
) -> SimulationResult:
    """Run `load` against one replica of `config` and summarise it.

    `cost_model` prices the steps in place of `profile`'s model (or the analytical default).

    `bulk_decodes=False` runs every step through the scheduler's per-request path (the reference
    bulk decodes are tested against); results are the same, byte for byte.
    """
    model = config.model_spec
    plan, arrivals = sample_traffic(load, model.vocab_size)
    scheduler = build_scheduler(config, check_invariants)
    manager = scheduler.kv_cache_manager
    cost = cost_model if cost_model is not None else build_cost_model(config, profile)
    runner = CostModelRunner(
        cost, vocab_size=model.vocab_size, shared_block_refs=shared_blocks_counter(cost, scheduler)
    )
    env = simpy.Environment()
    metrics = MetricsCollector()
    averager = WasteAverager()
    probe = _kv_probe(scheduler, manager, averager, env)
    bulk = (
        BulkDecodes.for_config(config, scheduler, runner, metrics.records) if bulk_decodes else None
    )
    engine = ServingEngine(env, scheduler, runner, metrics, probe, bulk_decodes=bulk)
    clients = _Clients(env, engine, plan, arrivals, load.max_concurrency, progress)
    env.run()

    total = clients.num_sent
    if len(metrics.records) != total or not clients.all_done:
        raise InternalError(
            f"simulation ended with {total - clients.num_done} of {total} requests unfinished"
        )
    if check_invariants:
        _check_drained(manager)
    check_no_leak(manager)  # every run: two counters, so a leak is a bug report, not exit 0
    result = summarize(
        metrics, percentiles=load.percentiles, goodput_slos_ms=dict(load.goodput_slos_ms) or None
    )
    result.update(_pagesim_keys(config, scheduler, metrics, averager))
    return SimulationResult(result=result, metrics=metrics, config=config, load=load)


class RequestSink(Protocol):
    """Where clients send requests: one engine, or the router in front of several."""

    on_finish: list[Callable[[Request], None]]

    def add_request(self, request: Request) -> None: ...


class _Clients:
    """Users of the service, one per session (a single request is a session of one turn).
    Later turns are closed loop: sent a think time after the previous answer.

    Each session arrives through a timeout scheduled at construction, in session order (the
    order in which one process per session, started at t=0, would schedule them), whose
    callback sends the first turn. A session that waits for anything afterwards (more turns,
    or a `--max-concurrency` slot) continues as a SimPy process started by that callback;
    it runs next, before any other event. A session of one turn without a concurrency cap
    has nothing to wait for, and needs no process.
    """

    def __init__(
        self,
        env: simpy.Environment,
        engine: RequestSink,
        plan,
        arrivals: np.ndarray,
        max_concurrency: int | None,
        progress: ProgressHook | None,
    ) -> None:
        self.env, self.engine, self.plan = env, engine, plan
        self.slots = simpy.Resource(env, capacity=max_concurrency) if max_concurrency else None
        self.progress = progress
        self.num_sent = 0
        self.num_done = 0
        self.num_expected = int(len(plan.prompt_lens)) * plan.n  # n samples per prompt
        self._done: dict[str, simpy.Event] = {}
        engine.on_finish.append(self._on_finish)
        if len(arrivals) < plan.num_sessions:
            raise InternalError(f"arrivals: {len(arrivals)} times for {plan.num_sessions} sessions")
        # One long-lived timeout per session, made in a burst: the cyclic collector would
        # walk every object made so far several times over while they pile up (at 100k
        # sessions, 0.6 s of 0.7 s), and none of them can be garbage; it is paused meanwhile.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            arrive = self._arrive
            for s, arrival_s in enumerate(arrivals[: plan.num_sessions].tolist()):
                env.timeout(arrival_s, s).callbacks.append(arrive)
        finally:
            if gc_was_enabled:
                gc.enable()

    @property
    def all_done(self) -> bool:
        return self.num_done == self.num_sent == self.num_expected

    def _on_finish(self, request: Request) -> None:
        self.num_done += 1
        event = self._done.pop(request.request_id, None)
        if event is not None:
            event.succeed()
        if self.progress is not None:
            self.progress(self.num_done, self.num_expected)

    def _send(self, request: Request):
        """Send one request (its n samples) and wait for its last token (holding one
        concurrency slot for all samples, as one client call)."""
        samples = self.plan.samples(request)
        events = []
        for sample in samples:
            events.append(self.env.event())
            self._done[sample.request_id] = events[-1]
        done = events[0] if len(events) == 1 else self.env.all_of(events)
        self.num_sent += len(samples)
        if self.slots is None:
            for sample in samples:
                self.engine.add_request(sample)
            yield done
            return
        with self.slots.request() as slot:
            yield slot
            for sample in samples:
                sample.arrival_time = self.env.now
                self.engine.add_request(sample)
            yield done

    def _arrive(self, event: simpy.Event) -> None:
        """A session arrives now (the timeout's value is its index): its first turn is sent,
        by a process if it must wait."""
        session = self.plan.session(event.value)
        request = session.first_request(self.env.now)
        if self.slots is None and not session.has_next():  # nothing to wait for
            if self.plan.n == 1:
                self.num_sent += 1
                self.engine.add_request(request)
                return
            samples = self.plan.samples(request)
            self.num_sent += len(samples)
            for sample in samples:
                self.engine.add_request(sample)
        else:
            self.env.process(self._user(session, request))

    def _user(self, session: Session, request: Request):
        """The rest of a session, from sending its first turn (`request`) on."""
        env = self.env
        yield from self._send(request)
        while session.has_next():
            yield env.timeout(session.next_think_time_s())
            request = session.next_request(request, env.now)
            yield from self._send(request)


def _kv_probe(scheduler, manager, averager: WasteAverager, env: simpy.Environment) -> WasteProbe:
    """Per-step KV state: usage and the four-way waste split, time-weighted into `averager`."""
    return WasteProbe(scheduler, manager, averager, env)


def _check_drained(manager) -> None:
    """Every block free or cached-free once all requests ended (no leak).

    The paged manager's `check_invariants` is its per-operation flag, so its checker is the
    module function; a contiguous manager has a `check_invariants()` method.
    """
    if manager.is_contiguous:
        manager.check_invariants()
    else:
        check_kv_cache_manager(manager)


def check_no_leak(manager) -> None:
    """The cheap end-of-run check every run makes: with all requests finished, every usable
    block is free (or cached-free). A leak is a bug in pagesim: `InternalError`."""
    if manager.num_free_blocks != manager.num_usable_blocks:
        raise InternalError(
            f"KV blocks leaked: {manager.num_usable_blocks - manager.num_free_blocks}"
            " still in use after all requests finished"
        )


def _pagesim_keys(
    config: EngineConfig, scheduler, metrics: MetricsCollector, averager: WasteAverager
) -> dict[str, Any]:
    """pagesim's own result keys: the shared engine counters plus the time-weighted waste."""
    keys = engine_keys(metrics, scheduler.stats, scheduler.kv_cache_manager.num_usable_blocks + 1)
    waste = averager.mean()
    keys.update(
        {
            "kv_token_state_frac": waste.token_states if waste else 0.0,
            "kv_reserved_frac": waste.reserved if waste else 0.0,
            "kv_internal_frag_frac": waste.internal_fragmentation if waste else 0.0,
            "kv_external_frag_frac": waste.external_fragmentation if waste else 0.0,
            "kv_free_frac": waste.free if waste else 0.0,
            "engine_config": asdict(config),
        }
    )
    return keys


#: The load settings a run's metadata carries (as vllm bench's result JSON does).
METADATA_LOAD_KEYS = (
    "workload",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "seed",
)


def result_metadata(config: EngineConfig, load: LoadSpec) -> dict[str, Any]:
    """Run metadata keys that `vllm bench serve` writes before the metrics."""
    doc: dict[str, Any] = {"backend": "pagesim", "model_id": config.model, "gpu": config.gpu}
    doc |= {key: getattr(load, key) for key in METADATA_LOAD_KEYS}
    if load.request_rate is not None and math.isinf(load.request_rate):
        doc["request_rate"] = "inf"
    return doc
