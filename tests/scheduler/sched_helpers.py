"""Helpers for the scheduler tests: engine configs, requests and a lock-step driver."""

from __future__ import annotations

from weakref import WeakKeyDictionary

from pagesim.config import EngineConfig
from pagesim.errors import InternalError
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.request import Request
from pagesim.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput, synthetic_token
from pagesim.scheduler.output import BlockIds, ScheduledRequest


def make_kv(
    num_gpu_blocks: int,
    block_size: int = 16,
    enable_caching: bool = True,
    check_invariants: bool = True,
) -> KVCacheManager:
    """The real manager, vLLM 0.33 free order, with its invariant checker after every call."""
    return KVCacheManager(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        enable_caching=enable_caching,
        vllm_compat="0.33",
        check_invariants=check_invariants,
    )


def make_config(**kw) -> EngineConfig:
    base = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256, block_size=16)
    base.update(kw)
    return EngineConfig(**base)


def make_scheduler(num_gpu_blocks: int, **kw) -> Scheduler:
    cfg = make_config(**kw)
    return Scheduler(cfg, make_kv(num_gpu_blocks, cfg.block_size))


def req(rid: str, prompt: list[int] | int, max_tokens: int = 4, **kw) -> Request:
    """A request; an int prompt means that many tokens unique to this request."""
    if isinstance(prompt, int):
        base = 1000 * (sum(map(ord, rid)) + 1)
        prompt = list(range(base, base + prompt))
    return Request(rid, prompt, max_tokens, **kw)


def apply_block_ids(rows: dict[str, BlockIds], sr: ScheduledRequest) -> BlockIds:
    """`sr`'s request's row(s) after its step, updated in `rows` (a runner's copy of every
    live request's rows; the runner drops finished and preempted ids itself)."""
    whole = sr.block_ids
    if whole is not None:
        rows[sr.request_id] = copy = (
            list(whole) if isinstance(whole, list) else tuple(list(g) for g in whole)
        )
        return copy
    row = rows.get(sr.request_id)
    if row is None:
        raise InternalError(f"request {sr.request_id!r}: new block ids for a row never sent")
    if isinstance(row, list):
        row.extend(sr.new_block_ids)
    else:
        for group, new in zip(row, sr.new_block_ids, strict=False):
            group.extend(new)
    return row


_TABLES: WeakKeyDictionary[Scheduler, dict[str, BlockIds]] = WeakKeyDictionary()


def tables(sched: Scheduler) -> dict[str, BlockIds]:
    """The block tables a runner holds after `sched`'s last `run_step`, built from the
    outputs' block-id deltas alone."""
    return _TABLES.setdefault(sched, {})


def follow_rows(sched: Scheduler, out: SchedulerOutput) -> None:
    """Apply `out`'s block ids to `tables(sched)` as a runner does, and check that every
    scheduled request's table equals its row in the manager."""
    rows = tables(sched)
    for rid in (*out.finished_req_ids, *out.preempted_req_ids):
        rows.pop(rid, None)
    for sr in out.scheduled:
        got = apply_block_ids(rows, sr)
        assert got == sched.kv_cache_manager.get_block_ids(sr.request_id), sr.request_id


def run_step(sched: Scheduler) -> tuple[SchedulerOutput, list[Request]]:
    """schedule() (its block ids followed: `follow_rows`), sample a token for every request
    that completed its tokens, update."""
    out = sched.schedule()
    follow_rows(sched, out)
    sampled = {}
    for sr in out.scheduled:
        r = sr.request
        if sr.num_computed_tokens + sr.num_new_tokens >= r.num_tokens:
            sampled[r.request_id] = synthetic_token(r, r.num_output_tokens)
    finished = sched.update_from_output(out, ModelRunnerOutput(0.01, sampled))
    return out, finished


def tokens(out: SchedulerOutput) -> dict[str, int]:
    """request id -> tokens scheduled, in scheduled order."""
    return {sr.request_id: sr.num_new_tokens for sr in out.scheduled}
