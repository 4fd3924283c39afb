"""Every step of a stored real run, rebuilt exactly by replaying its schedule.

A real run (`pagesim validate`'s real-run file) keeps per-step sums only. Its scheduler is
deterministic given which requests had arrived when each step was scheduled, so replaying the
same requests through the same `Scheduler` over the same KV cache, admitting before each step
what had arrived when the serve loop admitted (the previous step's end; the step's start after
an idle wait), rebuilds each step's members exactly: every decode
context, every prefill entry with its cached prefix, and the block pool's shared references
(`BlockPool.num_shared_refs`, what the simulator prices shared-prefix reads from), which the
request records cannot give. Each replayed step is checked against the runner's record
(requests, tokens, decodes, context sum); the replay stops at the first step that disagrees.

    from step_replay import replay_shapes
    shapes = replay_shapes(doc)  # one BatchShape per runner step, None after a mismatch
"""

from __future__ import annotations

from typing import Any

from pagesim.cost.base import BatchShape
from pagesim.scheduler.factory import make_scheduler
from pagesim.sim.runner import CostModelRunner
from pagesim.validate import build_requests, load_args, real_run_config

#: Clock slack of the serve loop's admission (`pagesim.gpu.serve.ARRIVAL_SLACK_S`).
SLACK_S = 1e-9


class _ZeroCost:
    """A cost model whose steps take no time: the replay needs the runner's sampling only."""

    def step_time(self, shape: BatchShape) -> float:
        return 0.0


def replay_shapes(doc: dict[str, Any], max_tries: int = 32) -> list[BatchShape | None]:
    """One `BatchShape` per runner step of `doc` (with `shared_context_tokens`), None from the
    first step whose replay disagrees with the record on.

    The serve loop admits at the top of its loop, just after the previous step ended, or, idle,
    after sleeping to the next arrival, just before the step starts. A request that arrived
    between the end of one step and the start of the next may have been admitted either way:
    the replay admits up to the step's start, and where that disagrees with the record, runs
    again admitting that step's requests up to the previous step's end."""
    early: set[int] = set()
    for _ in range(max_tries):
        shapes, mismatch = _replay(doc, early)
        if mismatch is None or mismatch in early:
            return shapes
        early.add(mismatch)
    return shapes


def _replay(doc: dict[str, Any], early: set[int]) -> tuple[list[BatchShape | None], int | None]:
    config = real_run_config(doc)
    load = doc["load"]
    rate, burstiness, params = load_args(load)
    pending = sorted(
        build_requests(
            config, load["workload"], load["num_prompts"], load["seed"], rate, burstiness, **params
        ),
        key=lambda r: r.arrival_time,
    )
    scheduler = make_scheduler(config, config.num_gpu_blocks_override)
    pool = scheduler.kv_cache_manager.block_pool
    runner = CostModelRunner(_ZeroCost(), vocab_size=config.model_spec.vocab_size)
    rs, st = doc["records"]["runner_steps"], doc["records"]["steps"]
    shapes: list[BatchShape | None] = [None] * len(st["start_s"])
    i = 0
    prev_end = 0.0
    for s, start in enumerate(st["start_s"]):
        limit = prev_end if s in early else start
        while i < len(pending) and pending[i].arrival_time <= limit + SLACK_S:
            scheduler.add_request(pending[i])
            i += 1
        out = scheduler.schedule()
        shape = BatchShape.from_scheduler_output(out)
        if (
            len(out.scheduled),
            out.total_num_scheduled_tokens,
            shape.num_decode_seqs,
            shape.decode_context_sum + sum(shape.prefill_context_tokens),
        ) != (
            rs["num_reqs"][s],
            rs["num_tokens"][s],
            rs["num_decode_reqs"][s],
            rs["context_sum"][s],
        ):
            return shapes, s
        shape.shared_context_tokens = pool.num_shared_refs * config.block_size
        shape.decode_context_tokens = list(shape.decode_context_tokens)
        shapes[s] = shape
        scheduler.update_from_output(out, runner.execute_model(out))
        prev_end = start + st["schedule_s"][s] + st["execute_s"][s] + st["update_s"][s]
    return shapes, None
