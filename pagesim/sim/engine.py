"""One serving engine (a vLLM replica) as a SimPy process.

The engine loop is vLLM's busy loop with time made explicit:

    schedule() -> runner.execute_model() -> yield env.timeout(step_time) -> update_from_output()

An idle engine waits on an event that `add_request` triggers; simulated time moves only through
`env.timeout`. Tokens become visible to clients at the end of the step that sampled them.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from pagesim.errors import PagesimError
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.output import ModelRunner
from pagesim.metrics.collector import MetricsCollector

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
    ) -> None:
        self.env = env
        self.scheduler = scheduler
        self.runner = runner
        self.metrics = metrics
        self.kv_probe = kv_probe
        self.on_finish: list[FinishCallback] = []
        self.num_preemptions = 0
        self._idle: simpy.Event | None = None
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
        env, scheduler, metrics = self.env, self.scheduler, self.metrics
        records = metrics.records
        while True:
            if not scheduler.has_unfinished_requests():
                self._idle = env.event()
                yield self._idle
                self._idle = None
            out = scheduler.schedule()
            # A step that only preempts is progress: vLLM 0.23's priority policy stops
            # scheduling when a request is its own victim, and vLLM then runs an empty step.
            if not (out.scheduled or out.preempted_req_ids or out.blocks_to_swap_out
                    or out.blocks_to_swap_in):
                raise PagesimError(
                    f"scheduler made no progress at t={env.now:.6f}s with "
                    f"{scheduler.get_request_counts()} requests (running, waiting)")
            start = env.now
            num_prefill = num_decode = 0
            for sr in out.scheduled:
                computed = sr.num_computed_tokens
                if sr.num_new_tokens == 1 and computed > 0:
                    num_decode += 1
                else:
                    num_prefill += sr.num_new_tokens
                if computed == (sr.request.num_cached_tokens or 0):  # first step of an admission
                    metrics.on_first_scheduled(sr.request, start)
            result = self.runner.execute_model(out)
            yield env.timeout(result.step_time_s)
            now = env.now
            finished = scheduler.update_from_output(out, result)
            itl_append = metrics.itl_s.append
            for request_id in result.sampled_token_ids:  # inlined MetricsCollector.on_token
                rec = records[request_id]
                if rec.first_token_time is None:
                    rec.first_token_time = now
                else:
                    itl_append(now - rec.last_token_time)
                rec.last_token_time = now
                rec.num_output_tokens += 1
            if result.sampled_token_ids:
                metrics.on_tokens_visible(now, len(result.sampled_token_ids))
            for req in finished:
                metrics.on_finish(req, now)
                self._finished(req)
            num_running, num_waiting = scheduler.get_request_counts()
            usage, token_state, reserved, internal, external = self.kv_probe()
            self.num_preemptions += len(out.preempted_req_ids)
            metrics.on_step((
                start, result.step_time_s, len(out.scheduled), out.total_num_scheduled_tokens,
                num_prefill, num_decode, num_running, num_waiting, usage, token_state, reserved,
                internal, external, len(out.preempted_req_ids), out.swap_bytes,
            ))
