"""One serving engine (a vLLM replica) as a SimPy process.

The engine loop is vLLM's busy loop with time made explicit:

    schedule() -> runner.execute_model() -> yield env.timeout(step_time) -> update_from_output()

Where its parts allow it (`DecodeFastPath.supports`), steps go through the decode fast path
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
from pagesim.metrics.collector import MetricsCollector
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.output import ModelRunner
from pagesim.sim.fast_path import DecodeFastPath

# () -> (kv_usage, token_state, reserved, internal_frag, external_frag): fractions of KV memory
KVProbe = Callable[[], tuple[float, float, float, float, float]]
FinishCallback = Callable[[Request], None]


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
        fast_path: bool = True,
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.runner = runner
        self.metrics = metrics
        self.kv_probe = kv_probe
        self.on_finish: list[FinishCallback] = []
        self._idle: simpy.Event | None = None
        # The decode fast path (same results, less work per step) where its parts allow it.
        self.fast_path = (
            DecodeFastPath(scheduler, runner, metrics.records)
            if fast_path and DecodeFastPath.supports(scheduler, runner, kv_probe)
            else None
        )
        # The probe's all-lead snapshot applies (a paged KV cache).
        self._lead_probe = self.fast_path is not None and self.fast_path.paged
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
        fast = self.fast_path
        timeout = env.timeout
        peek = env.peek
        while True:
            if not scheduler.has_unfinished_requests():
                self._idle = env.event()
                yield self._idle
                self._idle = None
            start = env.now
            if fast is not None and fast.begin_step(start):
                num_lead = len(fast.lazies)
                if scheduler.skip_lead_only_step(num_lead):  # the common step: decodes only
                    step_time = self.runner.lead_decode_step_time(
                        scheduler.block_size,
                        num_lead,
                        fast.lead_context_sum(),
                        fast.lead_contexts(),
                    )
                    if peek() > start + step_time:
                        env._now = start + step_time  # see `_advance`
                    else:
                        yield timeout(step_time)
                    self._lead_only_end(fast, start, step_time)
                    continue
                out, result, num_prefill, num_decode = self._fast_begin(fast, start)
                if peek() > start + result.step_time_s:
                    env._now = start + result.step_time_s  # see `_advance`
                else:
                    yield timeout(result.step_time_s)
                self._fast_end(fast, start, out, result, num_prefill, num_decode)
            else:
                out, result, num_prefill, num_decode = self._slow_begin(start)
                yield timeout(result.step_time_s)
                self._slow_end(start, out, result, num_prefill, num_decode)

    # `_advance`: when the next scheduled event of the environment comes strictly after a
    # step's end, `yield env.timeout(step)` would put the step's end on the event queue, pop
    # it straight back and resume this process at `env.now + step` with nothing run in between;
    # the fast steps set the clock to that same float instead (SimPy computes the timeout's
    # time as `now + delay` too). Events at the same time keep their order: a tie (`peek() ==`
    # the end) takes the queue, where the earlier-scheduled event runs first as before.

    def _slow_begin(self, start: float):
        """schedule() and execute_model() of a step through the per-request path."""
        scheduler = self.scheduler
        out = scheduler.schedule()
        # A step that only preempts is progress: vLLM 0.23's priority policy stops scheduling
        # when a request is its own victim, and vLLM then runs an empty step.
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
        num_prefill, num_decode = self._note_scheduled(out, start)
        return out, self.runner.execute_model(out), num_prefill, num_decode

    def _slow_end(self, start: float, out, result, num_prefill: int, num_decode: int) -> None:
        """update_from_output() and the step's records, once its time has passed."""
        scheduler = self.scheduler
        now = self.env.now
        finished = scheduler.update_from_output(out, result)
        self._note_tokens(result.sampled_token_ids, now, 0)
        self._close_step(
            None,
            now,
            finished,
            start,
            result.step_time_s,
            len(out.scheduled),
            out.total_num_scheduled_tokens,
            num_prefill,
            num_decode,
            len(out.preempted_req_ids),
            out.swap_bytes,
        )

    def _fast_begin(self, fast: DecodeFastPath, start: float):
        """A step whose first running requests are the fast path's lazy decodes (their events
        of this step already run by `begin_step`): the rest of it through the scheduler."""
        num_lead = len(fast.lazies)
        out = self.scheduler.schedule(num_lead)
        num_prefill, num_decode = self._note_scheduled(out, start)
        result = self.runner.execute_with_lead_decodes(
            out, num_lead, fast.lead_context_sum(), fast.lead_contexts()
        )
        return out, result, num_prefill, num_decode + num_lead

    def _fast_end(
        self, fast: DecodeFastPath, start: float, out, result, num_prefill: int, num_decode: int
    ) -> None:
        """`_slow_end` for a fast step: lazy decodes first (as they come first in the batch)."""
        scheduler = self.scheduler
        now = self.env.now
        num_lead = len(fast.lazies)
        lead_finished = fast.end_step(now)
        scheduler.finish_decoded(lead_finished)
        finished = scheduler.update_from_output(out, result)
        self._note_tokens(result.sampled_token_ids, now, num_lead, now - start)
        if lead_finished:
            finished = lead_finished + finished
        self._close_step(
            fast,
            now,
            finished,
            start,
            result.step_time_s,
            len(out.scheduled) + num_lead,
            out.total_num_scheduled_tokens + num_lead,
            num_prefill,
            num_decode,
            len(out.preempted_req_ids),
            out.swap_bytes,
        )

    def _lead_only_end(self, fast: DecodeFastPath, start: float, step_time_s: float) -> None:
        """`_fast_end` for a step of lazy decodes only (no scheduler or runner output), with
        `_close_step` inlined (the most common step)."""
        scheduler, metrics = self.scheduler, self.metrics
        now = self.env._now
        num_lead = len(fast.lazies)
        finished = fast.end_step(now)
        if finished:
            scheduler.finish_decoded(finished)
        # `_note_tokens` of num_lead >= 1 lazy decodes and nothing sampled, inlined
        metrics.itl_run_s.append(now - start)
        metrics.itl_run_counts.append(num_lead)
        times = metrics.token_times_s
        if times and times[-1] == now:  # MetricsCollector.on_tokens_visible
            metrics.token_counts[-1] += num_lead
        else:
            times.append(now)
            metrics.token_counts.append(num_lead)
        for req in finished:
            metrics.on_finish(req, now)
            self._finished(req)
        running = scheduler.running
        n = len(fast.lazies)
        if self._lead_probe and len(running) == n:
            kv = self.kv_probe.lead_only(
                fast.lead_context_sum(), fast.min_span_sum, fast.over_final_sum
            )
        else:
            kv = self.kv_probe.with_lead_sums(*fast.probe_sums())
        metrics.on_step(
            (
                start,
                step_time_s,
                num_lead,
                num_lead,
                0,
                num_lead,
                len(running),
                len(scheduler.waiting) + len(scheduler.swapped),
                *kv,
                0,
                0,
            )
        )

    def _close_step(
        self,
        fast: DecodeFastPath | None,
        now: float,
        finished,
        start: float,
        step_time_s: float,
        num_reqs: int,
        num_tokens: int,
        num_prefill: int,
        num_decode: int,
        num_preempted: int,
        swap_bytes: int,
    ) -> None:
        """The end shared by every kind of step: finish its finished requests, then record the
        step (counts and the KV probe after the finishes; `fast` adds its lazy decodes' sums)."""
        metrics = self.metrics
        for req in finished:
            metrics.on_finish(req, now)
            self._finished(req)
        num_running, num_waiting = self.scheduler.get_request_counts()
        kv = self.kv_probe() if fast is None else self.kv_probe.with_lead_sums(*fast.probe_sums())
        metrics.on_step(
            (
                start,
                step_time_s,
                num_reqs,
                num_tokens,
                num_prefill,
                num_decode,
                num_running,
                num_waiting,
                *kv,
                num_preempted,
                swap_bytes,
            )
        )

    def _note_scheduled(self, out, start: float) -> tuple[int, int]:
        """(prefill tokens, decode requests) of the scheduled entries; first schedulings."""
        metrics = self.metrics
        num_prefill = num_decode = 0
        for sr in out.scheduled:
            computed = sr.num_computed_tokens
            if sr.num_new_tokens == 1 and computed > 0:
                num_decode += 1
            else:
                num_prefill += sr.num_new_tokens
            if computed == (sr.request.num_cached_tokens or 0):  # first step of an admission
                metrics.on_first_scheduled(sr.request, start)
        return num_prefill, num_decode

    def _note_tokens(
        self, sampled: dict[str, int], now: float, num_lead: int, lead_gap_s: float = 0.0
    ) -> None:
        """Token metrics of a step: `num_lead` lazy decodes first (each a gap of
        `lead_gap_s`), then the sampled requests in order (inlined MetricsCollector.on_token)."""
        metrics = self.metrics
        records = metrics.records
        gaps, counts = metrics.itl_run_s, metrics.itl_run_counts
        if num_lead:  # one run of equal gaps (MetricsCollector.on_gaps, inlined)
            gaps.append(lead_gap_s)
            counts.append(num_lead)
        for request_id in sampled:
            rec = records[request_id]
            if rec.first_token_time is None:
                rec.first_token_time = now
            else:
                gaps.append(now - rec.last_token_time)
                counts.append(1)
            rec.last_token_time = now
            rec.num_output_tokens += 1
        if sampled or num_lead:
            metrics.on_tokens_visible(now, len(sampled) + num_lead)
