"""Drive one engine (vLLM's or pagesim's) through a parity workload and log its decisions.

Both recorders share this loop, so the two logs differ only where the engines decide
differently. Per engine step:

    1. add every request whose arrival condition holds (workload order);
    2. `schedule()`; read the scheduled ids and token counts, prefix hits of admitted requests,
       preemptions (in order), and the block tables of scheduled requests;
    3. feed a fake model output: every request whose computed tokens reached its length samples
       `synthetic_token(request, num_output_tokens)`; partial prefill chunks sample nothing;
    4. `update_from_output()`; read finished ids, the blocks whose cached hash was evicted
       (in eviction order) and the free-block queue.

When nothing is running or waiting, the clock jumps to the next arrival: idle steps decide
nothing. A step that schedules nothing while requests wait and none can arrive is a stall and
raises (the workload must fit the pool), unless it preempted: a preemption frees blocks, and
under vLLM 0.23's priority rules a request can preempt itself and be scheduled the next step.
Two such steps in a row are a stall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pagesim.parity.decisions import DecisionLog, StepDecisions, free_queue_edit
from pagesim.parity.workloads import ParityRequest, ParityWorkload


class ReplayError(RuntimeError):
    """The replay cannot go on (stall, or an engine broke an invariant the log relies on)."""


@dataclass(slots=True)
class StepObservation:
    """What an engine adapter reports for one step."""

    scheduled: list[tuple[str, int]]  # (request id, num_scheduled_tokens), schedule order
    hits: list[tuple[str, int]]  # (request id, prefix-hit tokens) of requests admitted now
    preempted: list[str]  # preemption order
    # scheduled request -> its whole table after schedule(): one row, or one row per KV cache
    # group when the workload has several
    block_tables: dict[str, list[int] | tuple[list[int], ...]]
    finished: list[str]  # finished in update_from_output
    evicted: list[int]  # blocks whose cached hash was dropped on reuse, in eviction order
    free_queue: list[int]  # free-block queue after the step, head (next evicted) first


class EngineAdapter(Protocol):
    """One engine, wrapped so that `replay` can drive it."""

    def add_request(
        self, request: ParityRequest, prompt_token_ids: list[int], arrival_step: int
    ) -> None: ...

    def step(self) -> StepObservation: ...

    def has_unfinished_requests(self) -> bool: ...

    def free_queue(self) -> list[int]: ...


def replay(
    workload: ParityWorkload,
    engine: EngineAdapter,
    recorded_with: dict,
    vllm_compat: str,
    max_steps: int = 200_000,
) -> DecisionLog:
    """Run the workload to completion through `engine`; return its decision log."""
    pending: list[ParityRequest] = list(workload.requests)
    finished_at: dict[str, int] = {}
    tables: dict[str, list[int]] = {}  # request id (":<group>" with several groups) -> row
    queue = engine.free_queue()
    log = DecisionLog(
        recorded_with=recorded_with,
        vllm_compat=vllm_compat,
        workload=workload.to_json(),
        initial_free_queue=list(queue),
        steps=[],
    )
    t = 0
    preempted_only = False  # the previous step preempted and decided nothing else
    while pending or engine.has_unfinished_requests():
        ready = [r for r in pending if (a := _arrival(r, finished_at)) is not None and a <= t]
        for r in ready:
            engine.add_request(r, workload.prompt(r.request_id), t)  # arrival_time = t
        pending = [r for r in pending if r not in ready]
        if not engine.has_unfinished_requests():
            t = _next_arrival(pending, finished_at, t)
            continue
        obs = engine.step()
        rec = StepDecisions(
            t=t,
            added=[r.request_id for r in ready],
            scheduled=obs.scheduled,
            hits=obs.hits,
            preempted=obs.preempted,
            finished=obs.finished,
            evicted=obs.evicted,
        )
        for rid in obs.preempted:
            _forget(rid, tables)
        for rid, _ in obs.scheduled:
            table = obs.block_tables[rid]
            if isinstance(table, tuple):  # one row per group, named "<rid>:<group>"
                for g, row in enumerate(table):
                    rec.new_blocks.extend(_table_growth(f"{rid}:{g}", tables, row, True))
            else:
                rec.new_blocks.extend(_table_growth(rid, tables, table))
        for rid in obs.finished:
            _forget(rid, tables)
            finished_at[rid] = t
        rec.free_queue_edit = free_queue_edit(queue, obs.free_queue)
        queue = obs.free_queue
        log.steps.append(rec)
        idle = not obs.scheduled and not obs.finished
        if idle and obs.preempted and not preempted_only:
            t += 1  # a preemption frees blocks: the next step may schedule (not a stall yet)
        elif idle:
            t = _next_arrival(pending, finished_at, t, stalled=True)
        else:
            t += 1
        preempted_only = idle and bool(obs.preempted)
        if len(log.steps) > max_steps:
            raise ReplayError(f"max_steps={max_steps}: replay did not finish")
    return log


def _table_growth(
    rid: str, tables: dict[str, list[int]], table: list[int], windowed: bool = False
) -> list[tuple[str, list[int]]]:
    """The ids appended to a row since the last step (all of a new row). A running row only
    grows, except that with `windowed` (a KV cache group of a hybrid layout) entries may turn
    into the null block 0, freed out of a sliding window: the freed blocks show in the free
    queue, so the log records only the growth."""
    old = tables.get(rid)
    tables[rid] = list(table)
    if old is None:
        return [(rid, list(table))]
    kept = table[: len(old)]
    if kept != old and not (
        windowed
        and len(kept) == len(old)
        and all(a == b or b == 0 for a, b in zip(old, kept, strict=True))
    ):
        raise ReplayError(f"request {rid}: block table {old} changed to {table} while running")
    return [(rid, list(table[len(old) :]))] if len(table) > len(old) else []


def _forget(rid: str, tables: dict[str, list[int]]) -> None:
    """Drop a request's row, or its rows of every group."""
    tables.pop(rid, None)
    g = 0
    while tables.pop(f"{rid}:{g}", None) is not None:
        g += 1


def _arrival(r: ParityRequest, finished_at: dict[str, int]) -> int | None:
    if r.after is None:
        return r.arrival_step
    done = finished_at.get(r.after)
    return None if done is None else done + 1 + r.delay


def _next_arrival(
    pending: list[ParityRequest], finished_at: dict[str, int], t: int, stalled: bool = False
) -> int:
    times = [a for r in pending if (a := _arrival(r, finished_at)) is not None]
    if not times:
        what = "requests wait but nothing can be scheduled" if stalled else "no request can arrive"
        raise ReplayError(f"step={t}: {what} (does the workload fit the KV pool?)")
    return max(t + 1, min(times))
