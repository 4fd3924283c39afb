"""vLLM v1's scheduler over the shared KV-cache core.

There is no prefill or decode phase. Each request has `num_tokens` (prompt + output) and
`num_computed_tokens` (K/V written or found in the prefix cache); each step hands out at most
`max_num_batched_tokens` so that the second catches up with the first:

1. running requests, in running order: `min(num_tokens - computed, threshold, budget left)`
   tokens each (a decode gets 1, an unfinished prompt a chunk). When `allocate_slots` fails,
   a victim is preempted (`preemption.py`) and the allocation retried, until it fits or the
   request is itself the victim.
2. only if nobody was preempted in this step: swapped-out requests are swapped back in (swap
   mode), then, only once none is left swapped, waiting requests are admitted in queue order
   while `max_num_seqs` and the budget allow. A prefix-cache hit starts a request with
   `num_computed_tokens > 0`. Admission stops at the first request that does not fit (with
   `scheduler_reserve_full_isl` its whole prompt must fit in free blocks).

`schedule()` advances `num_computed_tokens` by the scheduled tokens before returning, as vLLM
does (`_update_after_schedule`); `update_from_output` appends the sampled tokens, finishes the
requests that reached `max_tokens` and frees their blocks at once, in scheduled order.
"""

from __future__ import annotations

from pagesim.config import EngineConfig
from pagesim.errors import InternalError, WorkloadError
from pagesim.kvcache import sizing
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.admission import kv_fit_check, reject_reason
from pagesim.scheduler.output import BlockIds, ModelRunnerOutput, ScheduledRequest, SchedulerOutput
from pagesim.scheduler.preemption import CPUSwapPool, Preemptor, SchedulerStats, select_victim_index
from pagesim.scheduler.request_queue import create_request_queue

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_FINISHED_LENGTH = RequestStatus.FINISHED_LENGTH
_FINISHED_REJECTED = RequestStatus.FINISHED_REJECTED


class Scheduler:
    """Decides, step by step, which requests run and how many tokens each computes.

    `kv_cache_manager` is the paged `KVCacheManager` or a contiguous baseline; only their
    common methods are used. `swap_pool` serves `preemption_mode="swap"`; when it is None, one
    of `config.swap_space` GiB is built, with `page_size_bytes` (bytes of one KV block over
    all layers) taken from `pagesim.kvcache.sizing` unless given.
    """

    def __init__(
        self,
        config: EngineConfig,
        kv_cache_manager,
        swap_pool: CPUSwapPool | None = None,
        page_size_bytes: int | None = None,
        literal_victim_ties: bool = False,
    ) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.block_size = config.block_size
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.policy = config.scheduling_policy
        # vLLM 0.33 changed three things (see `schedule`); "0.23" keeps the older behaviour.
        self.vllm_033 = config.vllm_compat == "0.33"
        threshold = config.long_prefill_token_threshold
        if not self.vllm_033 and threshold == 0 and config.max_num_partial_prefills > 1:
            # vLLM <= 0.23 SchedulerConfig: with several partial prefills and no threshold,
            # 4% of max_model_len. vLLM 0.33 has no max_num_partial_prefills at all.
            threshold = int(config.max_model_len * 0.04)
        self.long_prefill_token_threshold = threshold
        self.reserve_full_isl = config.scheduler_reserve_full_isl
        if config.preemption_mode == "swap" and swap_pool is None:
            if page_size_bytes is None:
                page_size_bytes = sizing.page_size_bytes(
                    config.model_spec,
                    config.block_size,
                    config.kv_cache_dtype,
                    config.tensor_parallel_size,
                )
            swap_pool = CPUSwapPool.from_swap_space(config.swap_space, page_size_bytes)
        self.swap_pool = swap_pool
        self.stats = SchedulerStats()
        self.preemptor = Preemptor(
            kv_cache_manager, config.preemption_mode, self.block_size, swap_pool, self.stats
        )
        self.requests: dict[str, Request] = {}  # unfinished requests by id
        # Equal (priority, arrival time) victims: the later arrival gives way, or with
        # `literal_victim_ties` vLLM's first of the tied (`select_victim_index`).
        self.literal_victim_ties = literal_victim_ties
        self.waiting = create_request_queue(self.policy)  # new and recomputed requests
        self.swapped = create_request_queue(self.policy)  # swapped out, to swap back in first
        self.running: list[Request] = []  # admission order; the fcfs victim is the last
        self._can_fit = kv_fit_check(kv_cache_manager)  # request -> could it ever fit?
        self._step_id = 0
        self._finished_ids: list[str] = []  # finished since the last schedule()
        self._rejected_ids: list[str] = []  # rejected since the last schedule()

    # ---- requests in and out ----------------------------------------------------------------

    def add_request(self, request: Request) -> bool:
        """Queue a new request; False if it is rejected (status FINISHED_REJECTED, with reason)."""
        if request.request_id in self.requests:
            raise WorkloadError(f"request_id={request.request_id!r}: already added")
        if request.status != RequestStatus.WAITING or request.num_computed_tokens:
            raise WorkloadError(
                f"request_id={request.request_id!r}: status={request.status.name}, "
                "only fresh WAITING requests can be added"
            )
        self.stats.num_added += 1
        request.arrival_rank = self.stats.num_added
        reason = reject_reason(request, self.max_model_len, self._can_fit)
        if reason is not None:
            request.status = _FINISHED_REJECTED
            request.reject_reason = reason
            self.stats.num_rejected += 1
            self._rejected_ids.append(request.request_id)
            return False
        self.requests[request.request_id] = request
        self.waiting.add_request(request)
        return True

    def finish_requests(self, request_ids: list[str], reason: str = "aborted") -> list[Request]:
        """Abort unfinished requests: free their blocks, status FINISHED_REJECTED with `reason`."""
        aborted: list[Request] = []
        for request_id in request_ids:
            request = self.requests.pop(request_id, None)
            if request is None:
                continue
            status = request.status
            if status == _RUNNING:
                self.kv_cache_manager.free(request)
            elif status == RequestStatus.SWAPPED:
                self.swapped.remove_request(request)
            else:
                self.waiting.remove_request(request)
            self.preemptor.drop(request)
            request.status = _FINISHED_REJECTED
            request.reject_reason = reason
            aborted.append(request)
            self._finished_ids.append(request_id)
        if aborted:
            self.running = [r for r in self.running if r.status == _RUNNING]
            self.stats.num_rejected += len(aborted)
            self.stats.num_aborted += len(aborted)
        return aborted

    def has_unfinished_requests(self) -> bool:
        return bool(self.running or self.waiting or self.swapped)

    @property
    def num_swapped(self) -> int:
        return len(self.swapped)

    def get_request_counts(self) -> tuple[int, int]:
        """(num_running, num_waiting), as vLLM's `Scheduler.get_request_counts`; waiting counts
        the requests not running: waiting (new or preempted) and swapped out."""
        return len(self.running), len(self.waiting) + len(self.swapped)

    # ---- one step ----------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Decide this step. `num_computed_tokens` of every scheduled request is advanced.

        vLLM 0.33 (`vllm_compat="0.33"`) differs from 0.23 in three ways, all followed here:
        `long_prefill_token_threshold` is not applied when a single request is running or
        waiting at the start of the step (nobody to starve); and under `priority`, a victim
        taken from before the current position steps the position back whether or not it was
        scheduled yet, and a request that preempts itself lets the ones after it still run.
        """
        return self._schedule(0)

    # ---- bulk decodes: the simulator may account a step's routine decodes itself -------------
    # The first `num_bulk_decodes` running requests get one decode token each; the caller makes
    # their `allocate_slots` calls (or proves them no-ops), advances them, hands their finishes
    # to `finish_bulk_decodes`, and guarantees that none can be preempted in the step.

    def schedule_bulk(self, num_bulk_decodes: int) -> SchedulerOutput | None:
        """`schedule()` of a step whose first `num_bulk_decodes` running requests are decoded
        in bulk: they are left out of the output and of `total_num_scheduled_tokens`, and the
        step goes on from the next running request with the budget they leave. None when the
        output would carry nothing (no other request to schedule, no finished, rejected or
        preempted ids, no swap, no copy): the step is counted and nothing else changes."""
        if (
            num_bulk_decodes == len(self.running)
            and not self.waiting
            and not self.swapped
            and not self._finished_ids
            and not self._rejected_ids
            and not self.kv_cache_manager.num_blocks_to_copy
        ):
            self._step_id += 1
            return None
        return self._schedule(num_bulk_decodes)

    def finish_bulk_decodes(self, requests: list[Request]) -> None:
        """Finish bulk decodes that reached their length, their last sampled token appended by
        the caller: as `update_from_output` would, in the given (running) order, before
        `update_from_output` is called for the same step."""
        if not requests:
            return
        kv = self.kv_cache_manager
        for request in requests:
            request.status = _FINISHED_LENGTH
            kv.free(request)
            del self.requests[request.request_id]
            self._finished_ids.append(request.request_id)
        running = self.running
        if len(requests) == 1:  # the common case: one list copy without it, no status reads
            i = running.index(requests[0])
            self.running = running[:i] + running[i + 1 :]
        else:
            self.running = [r for r in running if r.status == _RUNNING]
        self.stats.num_finished += len(requests)

    def _schedule(self, num_bulk_decodes: int) -> SchedulerOutput:
        out = SchedulerOutput(
            step_id=self._step_id,
            block_size=self.block_size,
            finished_req_ids=self._finished_ids,
            rejected_req_ids=self._rejected_ids,
        )
        self._step_id += 1
        self._finished_ids = []
        self._rejected_ids = []
        if num_bulk_decodes == len(self.running) and not self.waiting and not self.swapped:
            # Nothing but the bulk decodes to schedule (what the steps below would find).
            out.blocks_to_copy = self.kv_cache_manager.take_blocks_to_copy()
            return out
        threshold = self.long_prefill_token_threshold
        if self.vllm_033 and len(self.running) + len(self.waiting) + len(self.swapped) <= 1:
            threshold = 0
        budget = self._schedule_running(
            out, self.max_num_batched_tokens - num_bulk_decodes, threshold, num_bulk_decodes
        )
        if not out.preempted_req_ids:
            if self.swapped:
                budget = self._schedule_swapped(out, budget, threshold)
            if not self.swapped:
                self._schedule_waiting(out, budget, threshold)
        kv = self.kv_cache_manager
        out.blocks_to_copy = kv.take_blocks_to_copy()
        if kv.rewritten_req_ids:
            self._send_rewritten_rows(out.scheduled, kv.rewritten_req_ids)
        total = 0
        for sr in out.scheduled:
            n = sr.num_new_tokens
            sr.request.num_computed_tokens += n
            total += n
        out.total_num_scheduled_tokens = total
        return out

    def _send_rewritten_rows(self, scheduled: list[ScheduledRequest], rewritten: set[str]) -> None:
        """Rows whose entries the manager replaced in place go out whole (membership only)."""
        for sr in scheduled:
            if sr.block_ids is None and sr.request.request_id in rewritten:
                sr.block_ids, sr.new_block_ids = self._row(sr.request.request_id), ()
        rewritten.clear()

    def _row(self, request_id: str) -> BlockIds:
        """A copy of the request's row(s) (the hybrid manager's rows are copies already)."""
        ids = self.kv_cache_manager.get_block_ids(request_id)
        return list(ids) if isinstance(ids, list) else ids

    def _schedule_running(
        self, out: SchedulerOutput, budget: int, threshold: int, start: int = 0
    ) -> int:
        running = self.running
        scheduled = out.scheduled
        allocate_slots = self.kv_cache_manager.allocate_slots
        last_position = self.max_model_len - 1  # the input position may not pass it
        priority = self.policy == "priority"
        req_index = start
        while req_index < len(running) and budget > 0:
            request = running[req_index]
            num_computed = request.num_computed_tokens
            num_new = len(request.prompt_token_ids) + len(request.output_token_ids) - num_computed
            if 0 < threshold < num_new:
                num_new = threshold
            if num_new > budget:
                num_new = budget
            if num_new > last_position - num_computed:
                num_new = last_position - num_computed
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                victim_index = select_victim_index(running, self.policy, self.literal_victim_ties)
                victim = running.pop(victim_index)
                if priority:
                    refund = self._unschedule(scheduled, victim)
                    if refund is not None:  # the victim was scheduled earlier in this step
                        budget += refund
                    if self.vllm_033:
                        req_index -= victim_index < req_index
                    elif refund is not None:
                        req_index -= 1
                self.preemptor.preempt(victim, self.waiting, self.swapped, out)
                if victim is request:
                    break
            if new_blocks is None:
                if priority and self.vllm_033:
                    continue  # it preempted itself; running[req_index] is the next one
                break
            scheduled.append(
                ScheduledRequest(request, num_new, num_computed, None, new_blocks.get_block_ids())
            )
            budget -= num_new
            req_index += 1
        return budget

    @staticmethod
    def _unschedule(scheduled: list[ScheduledRequest], victim: Request) -> int | None:
        """Take `victim` out of this step's schedule and return its tokens; None if absent.

        vLLM refunds the budget and steps its running index back only in the first case.
        """
        for j in range(len(scheduled) - 1, -1, -1):
            if scheduled[j].request is victim:
                return scheduled.pop(j).num_new_tokens
        return None

    def _schedule_swapped(self, out: SchedulerOutput, budget: int, threshold: int) -> int:
        """Swap requests back in, in queue order, before any new admission (V0 behaviour)."""
        kv = self.kv_cache_manager
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.swapped.peek_request()
            num_computed = request.num_computed_tokens
            num_new = self._chunk(request.num_tokens - num_computed, budget, threshold)
            if num_new is None:
                break
            if (
                kv.allocate_slots(request, num_new, full_sequence_must_fit=self.reserve_full_isl)
                is None
            ):
                break
            self.swapped.pop_request()
            block_ids = list(kv.get_block_ids(request.request_id))
            self.preemptor.swap_in(request, block_ids, out)
            request.status = _RUNNING
            self.running.append(request)
            out.scheduled.append(
                ScheduledRequest(request, num_new, num_computed, block_ids, resumed=True)
            )
            budget -= num_new
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, threshold: int) -> None:
        kv = self.kv_cache_manager
        waiting = self.waiting
        stats = self.stats
        while waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = waiting.peek_request()
            hit_blocks, num_hit = kv.get_computed_blocks(request)
            num_new = self._chunk(request.num_tokens - num_hit, budget, threshold)
            if num_new is None:
                break
            if (
                kv.allocate_slots(
                    request,
                    num_new,
                    num_new_computed_tokens=num_hit,
                    new_computed_blocks=hit_blocks,
                    num_lookahead_tokens=0,
                    full_sequence_must_fit=self.reserve_full_isl,
                )
                is None
            ):
                break
            waiting.pop_request()
            resumed = request.status == _PREEMPTED
            if resumed:
                self.preemptor.on_readmit(request, num_hit)
            stats.num_prefix_query_tokens += request.num_tokens
            stats.num_prefix_hit_tokens += num_hit
            request.status = _RUNNING
            request.num_computed_tokens = num_hit
            if request.num_cached_tokens is None:
                request.num_cached_tokens = num_hit
            self.running.append(request)
            out.scheduled.append(
                ScheduledRequest(
                    request,
                    num_new,
                    num_hit,
                    self._row(request.request_id),
                    resumed=resumed,
                    first_scheduled=not resumed,
                    num_prefix_hit_tokens=num_hit,
                )
            )
            budget -= num_new

    def _chunk(self, num_new: int, budget: int, threshold: int) -> int | None:
        """Tokens an admitted request computes in its first step; None: it must wait."""
        if 0 < threshold < num_new:
            num_new = threshold
        if num_new > budget:
            if not self.enable_chunked_prefill:
                return None  # vLLM: without chunked prefill the prompt waits for a fuller budget
            num_new = budget
        return num_new

    # ---- after the step ----------------------------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> list[Request]:
        """Append sampled tokens; return the requests that finished (FINISHED_LENGTH) now.

        A request samples when this step brought its K/V up to all its tokens; one that did but
        got no token is a runner bug and raises. Tokens for partial prefill chunks are ignored
        (vLLM discards them too). Finished requests free their blocks here, in scheduled order.
        """
        if not scheduler_output.scheduled:
            return []
        sampled = model_runner_output.sampled_token_ids
        max_model_len = self.max_model_len
        kv = self.kv_cache_manager
        finished: list[Request] = []
        for sr in scheduler_output.scheduled:
            request = sr.request
            if request.status != _RUNNING:
                continue  # aborted after schedule()
            output = request.output_token_ids
            num_tokens = len(request.prompt_token_ids) + len(output)
            if request.num_computed_tokens < num_tokens:
                continue  # a prefill chunk that stops inside the prompt samples nothing
            token = sampled.get(request.request_id)
            if token is None:
                raise InternalError(
                    f"request_id={request.request_id!r}: completed its tokens in step "
                    f"{scheduler_output.step_id} but the runner returned no sampled token"
                )
            output.append(token)
            if len(output) >= request.max_tokens or num_tokens + 1 >= max_model_len:
                request.status = _FINISHED_LENGTH
                kv.free(request)
                del self.requests[request.request_id]
                self._finished_ids.append(request.request_id)
                finished.append(request)
        if finished:
            self.running = [r for r in self.running if r.status == _RUNNING]
            self.stats.num_finished += len(finished)
        return finished
