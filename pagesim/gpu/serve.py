"""Real-time replay of a workload through the shared `Scheduler` and the `GPUModelRunner`.

The engine loop of `vllm serve` (engine core, no async scheduling), in wall-clock time:

    loop:
        admit every request whose arrival time has passed      (clients send at arrival)
        idle and none left to arrive soon?  sleep until the next arrival
        out = scheduler.schedule()                             host, measured
        runner.execute_model(out)                              prepare + GPU + sync, measured
        scheduler.update_from_output(...)                      host, measured
        tokens of this step become visible now                 (TTFT / ITL / E2E clocks)

Times are seconds since the run started (`perf_counter`), in the same `MetricsCollector`
(`pagesim.metrics`) the simulator fills, so `summarize` gives the same result keys. A request
is recorded as arriving at its planned arrival time (the client's send time, as `vllm bench
serve` measures TTFT), even when the busy engine picks it up a little later: that wait is part
of its TTFT, as in vLLM. The scheduler's CPU time between steps is real here and lands in the
step records (`ServeStep`), which is what the calibration's host-overhead table measures.

Multi-turn sessions are closed loop in wall-clock time: a later turn is sent when the previous
one finished plus its think time, and its prompt is built from the tokens the previous one
emitted, by the same `Session` cursor the simulator's clients walk
(`pagesim.workload.sessions.ClosedLoopSessions`).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from pagesim.config import EngineConfig
from pagesim.kvcache.waste import UsageProbe
from pagesim.metrics import MetricsCollector, summarize
from pagesim.metrics.collector import StepMetricsRow
from pagesim.metrics.report import engine_keys
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.factory import make_scheduler
from pagesim.scheduler.scheduler import Scheduler
from pagesim.workload.sessions import ClosedLoopSessions

# A request is admitted once the clock is within this of its arrival: the clock's float
# rounding (t0 + arrival - t0 != arrival) must not leave a due request waiting forever.
ARRIVAL_SLACK_S = 1e-9


@dataclass(slots=True)
class ServeStep:
    """Host and device time of one engine step of a real run (seconds)."""

    start_s: float  # since the run started
    num_reqs: int
    num_tokens: int
    schedule_s: float  # Scheduler.schedule()
    execute_s: float  # GPUModelRunner.execute_model (prepare + device + sync)
    update_s: float  # update_from_output + metrics bookkeeping
    period_s: float  # start of this step to start of the loop's next action
    num_prefill_reqs: int = 0  # entries that are not decodes (prompts or chunks of them)

    @property
    def host_overhead_s(self) -> float:
        """Loop time outside execute_model: what overhead.csv models."""
        return self.period_s - self.execute_s


@dataclass
class ServeRun:
    """Everything a real run produced."""

    metrics: MetricsCollector
    steps: list[ServeStep] = field(default_factory=list)
    wall_s: float = 0.0


def make_engine(config: EngineConfig, num_gpu_blocks: int) -> Scheduler:
    """The scheduler over a KV cache of `num_gpu_blocks`, assembled as the simulator assembles
    it (`pagesim.scheduler.factory`): same manager arguments, same swap pool sizing. A hybrid
    model gets the hybrid KV cache manager, one block-table row per KV cache group, which the
    runner's hybrid KV layout reads (`pagesim.gpu.kv_layout`)."""
    return make_scheduler(config, num_gpu_blocks)


class FixedArrivals:
    """Requests sent at their own arrival times, whatever the engine does (open loop): the
    `ClosedLoopSessions` interface over a list, in (arrival, index) order."""

    def __init__(self, requests: Sequence[Request]) -> None:
        order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_time, i))
        self._pending = [requests[i] for i in order]
        self._i = 0

    def next_time(self) -> float | None:
        return self._pending[self._i].arrival_time if self._i < len(self._pending) else None

    def due(self, now: float) -> list[Request]:
        pending, i, n = self._pending, self._i, len(self._pending)
        start = i
        while i < n and pending[i].arrival_time <= now:
            i += 1
        self._i = i
        return pending[start:i]

    def on_finish(self, request: Request, now: float) -> None:
        """Nothing follows a request of an open-loop load."""

    def unsent(self) -> list[Request]:
        return self._pending[self._i :]


def replay(
    requests: Sequence[Request] | ClosedLoopSessions,
    scheduler,
    runner,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    max_wall_s: float | None = None,
    disable_gc: bool = True,
) -> ServeRun:
    """Serve `requests` (arrival_time = seconds from the start) in real time; or the sessions
    of a multi-turn plan (`ClosedLoopSessions`), each later turn sent when the previous one
    finished plus its think time.

    `scheduler` is a `pagesim.scheduler.Scheduler`, `runner` any `ModelRunner` (the GPU runner
    here; a cost-model runner makes this a wall-clock dry run for tests). Requests are not
    copied: pass fresh ones. `max_wall_s` aborts the run (remaining requests are aborted and
    recorded as failed) so that a time-limited session still ends. Python's cyclic GC is
    paused during the run (a collection in the loop is a latency spike vLLM's engine avoids
    by freezing its heap; pagesim's simulator has none either).
    """
    source = requests if isinstance(requests, ClosedLoopSessions) else FixedArrivals(requests)
    metrics = MetricsCollector()
    run = ServeRun(metrics)
    records = metrics.records
    probe = UsageProbe(scheduler.kv_cache_manager)
    gc_was_enabled = gc.isenabled()
    if disable_gc:
        gc.collect()
        gc.disable()
    try:
        _loop(source, scheduler, runner, metrics, records, probe, run, clock, sleep, max_wall_s)
    finally:
        if disable_gc and gc_was_enabled:
            gc.enable()
    return run


def _admit(source, now, scheduler, metrics) -> None:
    """Add every request that has arrived by `now` (a rejected one ends at once, and its
    session goes on as after a finish)."""
    now += ARRIVAL_SLACK_S
    for req in source.due(now):
        metrics.on_arrival(req, req.arrival_time)
        scheduler.add_request(req)
        if req.status == RequestStatus.FINISHED_REJECTED:
            metrics.on_reject(req, now)
            source.on_finish(req, now)


def _loop(
    source, scheduler, runner, metrics, records, probe, run, clock, sleep, max_wall_s
) -> None:
    t0 = clock()
    on_token = metrics.on_token
    last: ServeStep | None = None
    while True:
        now = clock() - t0
        _admit(source, now, scheduler, metrics)
        if max_wall_s is not None and now > max_wall_s:
            _abort_rest(source.unsent(), scheduler, metrics, now)
            break
        if not scheduler.has_unfinished_requests():
            due = source.next_time()
            if due is None:
                break
            _wait_until(due, t0, clock, sleep)
            continue
        t_sched = clock()
        if last is not None:
            last.period_s = t_sched - t0 - last.start_s
        out = scheduler.schedule()
        start = t_sched - t0
        metrics.on_scheduled(out.scheduled, start)
        t_exec = clock()
        result = runner.execute_model(out)
        t_upd = clock()
        finished = scheduler.update_from_output(out, result)
        visible = clock() - t0
        for request_id in result.sampled_token_ids:
            rec = records.get(request_id)
            if rec is not None:
                on_token(rec, visible)
        for req in finished:
            metrics.on_finish(req, visible)
            source.on_finish(req, visible)
        counts = scheduler.get_request_counts()
        step = StepMetricsRow.of_step(start, visible - start, out, counts, probe())
        metrics.on_step(step)
        t_end = clock()
        last = ServeStep(
            start,
            len(out.scheduled),
            out.total_num_scheduled_tokens,
            t_exec - t_sched,
            t_upd - t_exec,
            t_end - t_upd,
            t_end - t_sched,
            len(out.scheduled) - step.num_decode_reqs,
        )
        run.steps.append(last)
    run.wall_s = clock() - t0


def _wait_until(target: float, t0: float, clock, sleep) -> None:
    """Sleep until `target` seconds after `t0` (Linux oversleeps by ~0.1 ms at most, far
    below any latency measured here; the request still counts from its planned arrival)."""
    left = target - (clock() - t0)
    if left > ARRIVAL_SLACK_S:
        sleep(left)


def _abort_rest(unsent: list[Request], scheduler, metrics, now: float) -> None:
    for req in unsent:
        metrics.on_arrival(req, req.arrival_time)
        rec = metrics.records[req.request_id]
        rec.reject_reason = "wall-clock limit"
        rec.finish_time = now
    for req in scheduler.finish_requests(list(scheduler.requests), reason="wall-clock limit"):
        rec = metrics.records[req.request_id]
        rec.reject_reason = req.reject_reason
        rec.finish_time = now


def serve_result(
    run: ServeRun, scheduler, config: EngineConfig, percentiles: tuple[float, ...] = (99,)
) -> dict[str, Any]:
    """The result keys of `pagesim run` for a real run: `summarize` (vllm bench's keys) plus
    the scheduler and KV counters the simulator reports. The waste split is not measured on
    the GPU (None). Host and device time per step are added under `gpu_*` keys."""
    result = summarize(run.metrics, percentiles=percentiles)
    result.update(
        engine_keys(run.metrics, scheduler.stats, scheduler.kv_cache_manager.num_usable_blocks + 1)
    )
    result.update(
        {
            "kv_token_state_frac": None,
            "kv_reserved_frac": None,
            "kv_internal_frag_frac": None,
            "kv_external_frag_frac": None,
            "kv_free_frac": None,
            "engine_config": asdict(config),
            "gpu_wall_s": run.wall_s,
            "gpu_schedule_s_mean": _mean([s.schedule_s for s in run.steps]),
            "gpu_execute_s_mean": _mean([s.execute_s for s in run.steps]),
            "gpu_host_overhead_s_mean": _mean([s.host_overhead_s for s in run.steps]),
        }
    )
    return result


def run_records(run: ServeRun) -> dict[str, Any]:
    """Raw records of a real run, JSON-ready: per request, pooled ITL, per step (`ServeStep`)."""
    return {
        "requests": [asdict(r) for r in run.metrics.records.values()],
        "itl_s": list(run.metrics.itl_s),
        "steps": {f.name: [getattr(s, f.name) for s in run.steps] for f in fields(ServeStep)},
    }


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def warm_up(runner, config: EngineConfig) -> int:
    """Run a few eager steps before the clock starts; returns how many ran.

    Graph keys are captured by `StepGraphs.capture_all`; steps above the largest mixed graph
    run eagerly, and their first call would otherwise pay one-off costs (cuBLAS heuristics
    for new GEMM shapes, lazy module loads, any Triton variant not met in a capture) inside a
    timed step (a stall of over a second). Synthetic steps of the sizes a
    run can meet (one long prefill, several entries together) take them now. They write K/V
    into blocks the scheduler has not handed out yet, which it overwrites before any read.
    The warm-up steps are dropped from the runner's step records.
    """
    from pagesim.gpu.calibrate import BlockSource, synthetic_step

    budget = config.max_num_batched_tokens
    shapes = [
        [(0, budget)],
        [(0, budget // 2)],
        [(64, budget // 16)] * 16,
        [(128, 1)] * 8 + [(0, budget // 4)] * 2,
    ]
    ran = 0
    records = len(runner.step_records)
    for spec in shapes:
        spec = [(c, n) for c, n in spec if n >= 1 and c + n <= config.max_model_len]
        if not spec or len(spec) > config.max_num_seqs:
            continue
        out = synthetic_step(spec, config.block_size, BlockSource.for_runner(runner, 1))
        if out is None:
            continue
        runner.execute_model(out)
        ran += 1
    del runner.step_records[records:]
    return ran
