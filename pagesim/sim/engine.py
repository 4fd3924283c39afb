"""One serving engine (a vLLM replica) as a SimPy process.

The engine loop is vLLM's busy loop with time made explicit:

    schedule() -> runner.execute_model() -> yield env.timeout(step_time) -> update_from_output()

Where the simulator gives it one (`DecodeFastPath.for_config`), steps go through the decode fast path
(`pagesim/sim/fast_path.py`): running requests that only decode are advanced in bulk and
brought up to date when anything can observe them, with the same results byte for byte;
`fast_path=False` keeps every step on the per-request path.

An idle engine waits on an event that `add_request` triggers; simulated time moves only through
`env.timeout`. Tokens become visible to clients at the end of the step that sampled them.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from pagesim.errors import InternalError
from pagesim.kvcache.waste import KVProbe
from pagesim.metrics.collector import MetricsCollector, StepRecord
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.output import ModelRunner, ModelRunnerOutput, SchedulerOutput
from pagesim.sim.fast_path import DecodeFastPath

FinishCallback = Callable[[Request], None]


# One step between its schedule and its end: (scheduler output, runner output (both None for
# a step of the fast path's lazy decodes only), step time (s), lazy decodes leading the batch
# (None: a step off the fast path)).
_Step = tuple[SchedulerOutput | None, ModelRunnerOutput | None, float, int | None]


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
        kv_probe: KVProbe,
        fast_path: DecodeFastPath | None = None,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.runner = runner
        self.metrics = metrics
        self.kv_probe = kv_probe
        self.on_finish: list[FinishCallback] = []
        self._idle: simpy.Event | None = None
        # The decode fast path (same results, less work per step): the simulator builds it
        # for the parts it built (`DecodeFastPath.for_config`); None: every step per request.
        self.fast_path = fast_path
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
        """schedule() and execute_model() of one step. Where the fast path takes the step, its
        lazy decodes lead the batch (their events of this step already run by `begin_step`)
        and the scheduler and runner see only the rest, or nothing when nothing else is due."""
        scheduler, runner, fast = self.scheduler, self.runner, self.fast_path
        if fast is None or not fast.begin_step(start):
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
            return out, result, result.step_time_s, None
        num_lead = len(fast.lazies)
        if scheduler.skip_lead_only_step(num_lead):  # the common step: lazy decodes only
            step_time_s = fast.runner.lead_decode_step_time(
                scheduler.block_size, num_lead, fast.lead_context_sum(), fast.lead_contexts()
            )
            return None, None, step_time_s, num_lead
        out = scheduler.schedule(num_lead)
        self.metrics.on_scheduled(out.scheduled, start)
        result = fast.runner.execute_with_lead_decodes(
            out, num_lead, fast.lead_context_sum(), fast.lead_contexts()
        )
        return out, result, result.step_time_s, num_lead

    def _end_step(
        self,
        start: float,
        out: SchedulerOutput | None,
        result: ModelRunnerOutput | None,
        step_time_s: float,
        num_lead: int | None,
    ) -> None:
        """Once the step's time has passed: the lazy decodes' tokens first (as they come first
        in the batch), then update_from_output(); finish the finished requests, then record
        the step (counts and the KV probe after the finishes). Arguments: `_Step`."""
        scheduler, metrics, fast = self.scheduler, self.metrics, self.fast_path
        now = self.env.now
        finished: list[Request] = []
        if num_lead is not None and fast is not None:
            finished = fast.end_step(now)
            if finished:
                scheduler.finish_decoded(finished)
        if out is not None and result is not None:
            done = scheduler.update_from_output(out, result)
            finished = finished + done if finished else done
            sampled = result.sampled_token_ids
        else:
            sampled = {}
        self._note_tokens(sampled, now, num_lead or 0, now - start)
        for req in finished:
            metrics.on_finish(req, now)
            self._finished(req)
        if num_lead is None or fast is None:
            kv = self.kv_probe()
        else:
            kv = self.kv_probe.with_lead_sums(*fast.probe_sums())
        counts = scheduler.get_request_counts()
        metrics.on_step(StepRecord.of_step(start, step_time_s, out, counts, kv, num_lead or 0))

    def _note_tokens(
        self, sampled: dict[str, int], now: float, num_lead: int, lead_gap_s: float
    ) -> None:
        """Token metrics of a step: `num_lead` lazy decodes first (each a gap of
        `lead_gap_s`), then the sampled requests in order; all visible at `now`."""
        metrics = self.metrics
        if num_lead:
            metrics.on_gaps(lead_gap_s, num_lead)
        metrics.on_tokens(sampled, now, num_lead)
