"""What a cost model sees of a step, and the protocol every cost model implements.

The simulator calls `BatchShape.from_scheduler_output(out)` and `CostModel.step_time(shape)` once
per simulated step (~50k steps for a 10k-request run, up to a few hundred requests per step), so
both are written for the hot path: one pass over the scheduled requests with plain Python ints,
no numpy on tiny arrays, no per-request objects.

Token accounting of one scheduled request (`num_computed_tokens` is the value *before* the step):

    | <- context (cached K/V, read) -> | <- new tokens (K/V written, queries) -> |
    0                        num_computed_tokens           num_computed_tokens + num_new_tokens

A *decode* entry is one new token over a non-empty context (`scheduler.output.is_decode`);
everything else (a whole prompt, a chunk of one, a recompute after preemption) is a *prefill*
entry, described by its new tokens and its context.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pagesim.errors import ConfigError
from pagesim.scheduler.output import SchedulerOutput, is_decode


def longest_context(contexts: Sequence[int]) -> int:
    """The longest of a step's decode contexts (0 for none). A sequence that knows its
    maximum (the simulator's views have `longest()`) answers without being iterated."""
    longest = getattr(contexts, "longest", None)
    if longest is not None:
        return longest()
    return max(contexts, default=0)


@dataclass(slots=True)
class BatchShape:
    """The shape of one engine step, in tokens (and bytes for swaps).

    Lists are aligned per entry; contexts are `num_computed_tokens` before the step, so a decode
    entry attends over `context + 1` tokens and a prefill entry over `context + new` tokens.
    """

    block_size: int  # tokens per KV block
    total_tokens: int  # sum of new tokens over all entries (== num_decode_seqs + prefill tokens)
    num_decode_seqs: int = 0
    decode_context_sum: int = 0  # sum of decode contexts (tokens)
    # [num_decode_seqs]; a list, or another sequence (the simulator's bulk decodes give
    # a view that computes its contexts when read: cost models that only need the sum
    # never pay for it)
    decode_context_tokens: Sequence[int] = field(default_factory=list)
    prefill_new_tokens: list[int] = field(default_factory=list)  # [num_prefill_reqs]
    prefill_context_tokens: list[int] = field(default_factory=list)  # [num_prefill_reqs]
    swap_bytes: int = 0  # bytes over the host link this step (swap out + swap in)
    num_blocks_to_copy: int = 0  # copy-on-write block copies on the GPU before the step
    # Context tokens the step's sequences read from KV blocks that two or more requests hold
    # (cached prefix blocks), counted once per reading sequence; None: unknown, every
    # sequence's context is its own.
    shared_context_tokens: int | None = None

    @property
    def num_prefill_reqs(self) -> int:
        return len(self.prefill_new_tokens)

    @property
    def num_reqs(self) -> int:
        return self.num_decode_seqs + len(self.prefill_new_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return self.total_tokens - self.num_decode_seqs

    @property
    def is_pure_decode(self) -> bool:
        return self.num_decode_seqs > 0 and not self.prefill_new_tokens

    @classmethod
    def from_scheduler_output(cls, out: SchedulerOutput) -> BatchShape:
        """Summarise a `SchedulerOutput` in one pass.

        Fast path (the common all-decode step): when `total_num_scheduled_tokens` equals the
        number of scheduled requests and every context is non-empty, every entry is a decode
        (the scheduler never schedules an entry with zero new tokens, so `total == num_reqs`
        means one token each). Otherwise one loop splits decode and prefill entries and the
        total is recounted from the entries.
        """
        sched = out.scheduled
        ctx = [s.num_computed_tokens for s in sched]
        n = len(ctx)
        if n and out.total_num_scheduled_tokens == n and min(ctx) > 0:
            return cls(
                out.block_size, n, n, sum(ctx), ctx, [], [], out.swap_bytes, len(out.blocks_to_copy)
            )
        dctx: list[int] = []
        pnew: list[int] = []
        pctx: list[int] = []
        total = 0
        for s, c in zip(sched, ctx, strict=True):
            k = s.num_new_tokens
            total += k
            if is_decode(k, c):
                dctx.append(c)
            else:
                pnew.append(k)
                pctx.append(c)
        return cls(
            out.block_size,
            total,
            len(dctx),
            sum(dctx),
            dctx,
            pnew,
            pctx,
            out.swap_bytes,
            len(out.blocks_to_copy),
        )

    @classmethod
    def decode(cls, batch_size: int, context_len: int, block_size: int = 16) -> BatchShape:
        """`batch_size` decode sequences, each over `context_len` cached tokens."""
        _require(block_size >= 1, "block_size", block_size)
        _require(batch_size >= 1, "batch_size", batch_size)
        _require(context_len >= 1, "context_len", context_len)
        ctx = [context_len] * batch_size
        return cls(block_size, batch_size, batch_size, context_len * batch_size, ctx)

    @classmethod
    def prefill(
        cls, num_new_tokens: int, num_cached_tokens: int = 0, block_size: int = 16
    ) -> BatchShape:
        """One request computing `num_new_tokens` over `num_cached_tokens` of cached prefix."""
        _require(block_size >= 1, "block_size", block_size)
        _require(num_new_tokens >= 1, "num_new_tokens", num_new_tokens)
        _require(num_cached_tokens >= 0, "num_cached_tokens", num_cached_tokens, "must be >= 0")
        return cls(
            block_size,
            num_new_tokens,
            prefill_new_tokens=[num_new_tokens],
            prefill_context_tokens=[num_cached_tokens],
        )

    @classmethod
    def mixed(
        cls,
        num_new_tokens: int,
        num_cached_tokens: int,
        decode_batch_size: int,
        decode_context_len: int,
        block_size: int = 16,
    ) -> BatchShape:
        """One prefill chunk plus a decode batch of equal contexts (the chunked-prefill step)."""
        _require(num_new_tokens >= 1, "num_new_tokens", num_new_tokens)
        _require(num_cached_tokens >= 0, "num_cached_tokens", num_cached_tokens, "must be >= 0")
        shape = cls.decode(decode_batch_size, decode_context_len, block_size)
        shape.prefill_new_tokens.append(num_new_tokens)
        shape.prefill_context_tokens.append(num_cached_tokens)
        shape.total_tokens += num_new_tokens
        return shape


@runtime_checkable
class CostModel(Protocol):
    """Predicts the wall time of one engine step.

    `step_time` returns seconds, is never negative, and is a pure function of the shape (same
    shape, same time), so simulations stay deterministic. Implementations may also offer
    `step_time_breakdown(shape) -> dict[str, float]` (seconds per component, summing to
    `step_time`) for `ModelRunnerOutput.time_breakdown_s`.
    """

    def step_time(self, batch: BatchShape) -> float: ...


class OneKindShapes:
    """`decode_time` and `prefill_time`: `step_time` of a decode-only step and of a one-prompt
    step, the two shapes tests, notebooks and planners reason in."""

    def step_time(self, batch: BatchShape) -> float:
        raise NotImplementedError

    def decode_time(self, batch_size: int, context_len: int, block_size: int = 16) -> float:
        """Seconds for a decode step of `batch_size` sequences over `context_len` tokens each."""
        return self.step_time(BatchShape.decode(batch_size, context_len, block_size))

    def prefill_time(
        self, num_new_tokens: int, num_cached_tokens: int = 0, block_size: int = 16
    ) -> float:
        """Seconds for a step computing one prompt (or chunk) over a cached prefix."""
        return self.step_time(BatchShape.prefill(num_new_tokens, num_cached_tokens, block_size))


def _require(ok: bool, name: str, value: object, why: str = "must be >= 1") -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")
