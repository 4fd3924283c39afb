"""One serving engine (a vLLM replica) as a SimPy process.

The engine loop is vLLM's busy loop with time made explicit:

    schedule() -> runner.execute_model() -> yield env.timeout(step_time) -> update_from_output()

Where the simulator gives it one (`BulkDecodes.for_config`), a step's routine decodes are
accounted in bulk (`pagesim/sim/bulk/decodes.py`): running requests that only decode are
advanced together and brought up to date when anything can observe them, with the same results
byte for byte; `bulk_decodes=False` keeps every step on the per-request path.

An idle engine waits on an event that `add_request` triggers; simulated time moves only through
`env.timeout`. Tokens become visible to clients at the end of the step that sampled them.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from pagesim.errors import InternalError
from pagesim.metrics.collector import MetricsCollector, StepMetricsRow
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.output import ModelRunner, ModelRunnerOutput, SchedulerOutput
from pagesim.sim.bulk.decodes import BulkDecodes
from pagesim.sim.probe import WasteProbe

FinishCallback = Callable[[Request], None]


# One step between its schedule and its end: (scheduler output, runner output (both None for
# a step of bulk decodes only), step time (s), bulk decodes at the head of the batch (0: none)).
_Step = tuple[SchedulerOutput | None, ModelRunnerOutput | None, float, int]


class ServingEngine:
    """A replica: a scheduler plus a runner, driven by SimPy time.

    `on_finish` callbacks fire when a request completes or is rejected (closed-loop clients and
    `--max-concurrency` wait on them).
    """

    def __init__(
        self,
        env: simpy.Environment,
        scheduler,  # pagesim.scheduler.Scheduler (duck-typed: the GPU replay uses it too)
        runner: ModelRunner,
        metrics: MetricsCollector,
        kv_probe: WasteProbe,
        bulk_decodes: BulkDecodes | None = None,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.runner = runner
        self.metrics = metrics
        self.kv_probe = kv_probe
        self.on_finish: list[FinishCallback] = []
        self._idle: simpy.Event | None = None
        # Bulk decodes (same results, less work per step): the simulator builds them for the
        # parts it built (`BulkDecodes.for_config`); None: every step per request.
        self.bulk_decodes = bulk_decodes
        self.process = env.process(self._loop())

    def add_request(self, request: Request) -> None:
        """A request arrives now. Rejected requests finish at once, with their reason."""
        now = self.env.now
        request.arrival_time = now
        self.metrics.on_arrival(request, now)
        self.scheduler.add_request(request)
        if request.status == RequestStatus.FINISHED_REJECTED:
            self.metrics.on_reject(request, now)
            self._finished(request)
            return
        if self._idle is not None and not self._idle.triggered:
            self._idle.succeed()

    def _finished(self, request: Request) -> None:
        for callback in self.on_finish:
            callback(request)

    def _loop(self):
        env, scheduler = self.env, self.scheduler
        timeout = env.timeout
        while True:
            if not scheduler.has_unfinished_requests():
                self._idle = env.event()
                yield self._idle
                self._idle = None
            start = env.now
            step = self._begin_step(start)
            yield timeout(step[2])
            self._end_step(start, *step)

    def _begin_step(self, start: float) -> _Step:
        """schedule() and execute_model() of one step. Where bulk decodes take part, they come
        first in the batch (their events of this step already run by `begin_step`) and the
        scheduler and runner see only the rest, or nothing when nothing else is due."""
        scheduler, runner, bulk = self.scheduler, self.runner, self.bulk_decodes
        num_bulk = bulk.begin_step(start) if bulk is not None else 0
        if bulk is None or not num_bulk:
            out = scheduler.schedule()
            # A step that only preempts is progress: vLLM 0.23's priority policy stops
            # scheduling when a request is its own victim, and vLLM then runs an empty step.
            if not (
                out.scheduled
                or out.preempted_req_ids
                or out.blocks_to_swap_out
                or out.blocks_to_swap_in
            ):
                raise InternalError(
                    f"scheduler made no progress at t={start:.6f}s with "
                    f"{scheduler.get_request_counts()} requests (running, waiting)"
                )
            self.metrics.on_scheduled(out.scheduled, start)
            result = runner.execute_model(out)
            return out, result, result.step_time_s, 0
        out = scheduler.schedule_bulk(num_bulk)
        if out is None:  # the common step: bulk decodes only
            step_time_s = bulk.runner.bulk_decode_step_time(
                scheduler.block_size, num_bulk, bulk.context_sum(), bulk.contexts()
            )
            return None, None, step_time_s, num_bulk
        self.metrics.on_scheduled(out.scheduled, start)
        result = bulk.runner.execute_with_bulk_decodes(
            out, num_bulk, bulk.context_sum(), bulk.contexts()
        )
        return out, result, result.step_time_s, num_bulk

    def _end_step(
        self,
        start: float,
        out: SchedulerOutput | None,
        result: ModelRunnerOutput | None,
        step_time_s: float,
        num_bulk: int,
    ) -> None:
        """Once the step's time has passed: the bulk decodes' tokens first (as they come first
        in the batch), then update_from_output(); finish the finished requests, then record
        the step (counts and the KV probe after the finishes). Arguments: `_Step`."""
        scheduler, metrics, bulk = self.scheduler, self.metrics, self.bulk_decodes
        now = self.env.now
        finished: list[Request] = []
        if num_bulk and bulk is not None:
            finished = bulk.end_step(now)
            if finished:
                scheduler.finish_bulk_decodes(finished)
        if out is not None and result is not None:
            done = scheduler.update_from_output(out, result)
            finished = finished + done if finished else done
            sampled = result.sampled_token_ids
        else:
            sampled = {}
        self._note_tokens(sampled, now, num_bulk, now - start)
        for req in finished:
            metrics.on_finish(req, now)
            self._finished(req)
        if not num_bulk or bulk is None:
            kv = self.kv_probe()
        else:
            kv = self.kv_probe.with_bulk_sums(*bulk.probe_sums())
        counts = scheduler.get_request_counts()
        metrics.on_step(StepMetricsRow.of_step(start, step_time_s, out, counts, kv, num_bulk))

    def _note_tokens(
        self, sampled: dict[str, int], now: float, num_bulk: int, bulk_gap_s: float
    ) -> None:
        """Token metrics of a step: `num_bulk` bulk decodes first (each a gap of
        `bulk_gap_s`), then the sampled requests in order; all visible at `now`."""
        metrics = self.metrics
        if num_bulk:
            metrics.on_gaps(bulk_gap_s, num_bulk)
        metrics.on_tokens(sampled, now, num_bulk)
