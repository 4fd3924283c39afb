"""The row types of a calibration profile's tables, one dataclass per CSV file.

A step row is its grid point (the leading integer columns, `KEY_COLUMNS`), then `StepTimes`,
then any column of its own. Each row class names `StepTimes` before its point class because a
dataclass takes its bases' fields in reverse method resolution order: so the point's columns
come first, and the order on disk and in the constructor is point, step times, own columns
(`pagesim.cost.profile` reads, writes and checks them). See `pagesim.cost.profile` for what
each table means.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pagesim.cost.base import BatchShape


@dataclass(frozen=True)
class StepTimes:
    """What every step table measures of its step, in ms: one set of columns, so that fitting,
    merging and checking read the same names from every table."""

    step_time_ms: float  # median
    step_time_p10_ms: float
    step_time_p90_ms: float
    attention_ms: float
    other_ms: float


@dataclass(frozen=True)
class DecodePoint:
    block_size: int
    batch_size: int
    context_len: int  # cached tokens per sequence before the step


@dataclass(frozen=True)
class DecodeRow(StepTimes, DecodePoint):
    """`batch_size` sequences of one new token over `context_len` cached tokens each."""


@dataclass(frozen=True)
class PrefillPoint:
    block_size: int
    num_new_tokens: int
    num_cached_tokens: int  # prefix already in the KV cache


@dataclass(frozen=True)
class PrefillRow(StepTimes, PrefillPoint):
    """One prefill entry of `num_new_tokens` over `num_cached_tokens` cached ones."""


@dataclass(frozen=True)
class MixedPoint(PrefillPoint):
    decode_batch_size: int
    decode_context_len: int


@dataclass(frozen=True)
class MixedRow(StepTimes, MixedPoint):
    """A prefill chunk (`num_new_tokens` over its `num_cached_tokens` cached prefix) plus a
    decode batch of equal contexts."""


@dataclass(frozen=True)
class MultiPrefillPoint:
    block_size: int
    num_entries: int
    num_new_tokens: int  # per entry
    num_cached_tokens: int  # per entry


@dataclass(frozen=True)
class MultiPrefillRow(StepTimes, MultiPrefillPoint):
    """`num_entries` prefill entries of `num_new_tokens` new tokens over `num_cached_tokens`
    cached ones each, in one step (what a burst of arrivals with a shared cached prefix makes)."""


@dataclass(frozen=True)
class DecodeSharedPoint(DecodePoint):
    shared_len: int  # leading tokens every sequence shares (whole blocks)


@dataclass(frozen=True)
class DecodeSharedRow(StepTimes, DecodeSharedPoint):
    """A decode batch whose sequences all start with the same `shared_len` cached tokens (the
    same blocks; `context_len` counts them): what a cached system prompt makes the decode
    kernel read `batch_size` times."""

    # the same batch and contexts over distinct blocks, timed in the same session: the ratio
    # of the two is what the re-read cost is fitted on, so the row holds for any profile of
    # this model and GPU
    reference_step_time_ms: float


@dataclass(frozen=True)
class DecodeSpreadPoint(DecodePoint):
    longest_context_len: int  # the longest sequence's cached tokens


@dataclass(frozen=True)
class DecodeSpreadRow(StepTimes, DecodeSpreadPoint):
    """A decode batch whose contexts have one mean (`context_len`) but different lengths
    (spread evenly up to `longest_context_len`): the decode kernel's programs are as long as
    their sequences' share of a partition, and a step whose programs differ in length takes
    longer than one where every sequence has the mean context."""

    # the same batch with every context at `context_len`, timed in the same rounds: the ratio
    # of the two is what the spread cost is fitted on
    uniform_step_time_ms: float


@dataclass(frozen=True)
class DecodeSharedSpreadPoint(DecodeSpreadPoint):
    shared_len: int  # leading tokens every sequence shares (whole blocks)


@dataclass(frozen=True)
class DecodeSharedSpreadRow(StepTimes, DecodeSharedSpreadPoint):
    """A decode batch as a prefix-caching server runs it: every sequence starts with the same
    `shared_len` cached tokens (one system prompt, the same blocks) and then its own part, of
    lengths spread evenly, so contexts (the shared tokens included, `context_len` their mean)
    run from `2 * context_len - longest_context_len` up to `longest_context_len`. The uniform
    shared rows (`DecodeSharedRow`) give every sequence one context; served steps never do."""

    reference_step_time_ms: float  # the same contexts over distinct blocks, same rounds


@dataclass(frozen=True)
class VarlenSharedPoint:
    block_size: int
    num_decodes: int
    decode_context_len: int  # per decode, the shared tokens included
    num_entries: int
    num_new_tokens: int  # per prefill entry, over `shared_len` cached tokens
    shared_len: int


@dataclass(frozen=True)
class VarlenSharedRow(StepTimes, VarlenSharedPoint):
    """A step through the variable-length kernel whose sequences all start with the same
    `shared_len` cached tokens: `num_decodes` decodes over `decode_context_len` tokens and
    `num_entries` prefill entries of `num_new_tokens` over the shared prefix (a burst of
    system-prompt requests joining a running batch that shares the prompt)."""

    reference_step_time_ms: float  # the same step over distinct blocks, same session


@dataclass(frozen=True)
class OverheadRow:
    num_reqs: int
    overhead_ms: float
    overhead_p10_ms: float
    overhead_p90_ms: float


@dataclass(frozen=True)
class AllReduceRow:
    tp: int  # GPUs in the all-reduce
    message_bytes: int  # bytes of the reduced tensor on each GPU
    time_us: float  # median
    time_p10_us: float
    time_p90_us: float


# table name -> (row class, required?)
TABLES: dict[str, tuple[type, bool]] = {
    "decode": (DecodeRow, True),
    "prefill": (PrefillRow, True),
    "mixed": (MixedRow, False),
    "multi_prefill": (MultiPrefillRow, False),
    "overhead": (OverheadRow, False),
    "allreduce": (AllReduceRow, False),
    "decode_shared": (DecodeSharedRow, False),
    "varlen_shared": (VarlenSharedRow, False),
    "decode_spread": (DecodeSpreadRow, False),
    "decode_shared_spread": (DecodeSharedSpreadRow, False),
}
# a table's grid point: its int columns, which lead it
KEY_COLUMNS = {
    name: sum(f.type == "int" for f in fields(row_cls)) for name, (row_cls, _) in TABLES.items()
}


def row_shapes(profile) -> list[tuple[str, int, Any]]:
    """(kind, tokens of the step, row) for every step row of the profile."""
    rows: list[tuple[str, int, Any]] = []
    rows += [("decode", r.batch_size, r) for r in profile.decode]
    rows += [("prefill", r.num_new_tokens, r) for r in profile.prefill]
    rows += [("mixed", r.num_new_tokens + r.decode_batch_size, r) for r in profile.mixed]
    rows += [("multi", r.num_entries * r.num_new_tokens, r) for r in profile.multi_prefill]
    return rows


def row_batch(kind: str, r) -> BatchShape | None:
    """The batch of a row that ran the variable-length kernel, else None (decode rows)."""
    if kind == "prefill" or (kind == "multi" and r.num_entries == 1):
        return BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size)
    return multi_part_shape(kind, r)


def multi_part_shape(kind: str, r) -> BatchShape | None:
    """The batch of a row with several parts (a mixed or multi-prefill row), else None."""
    if kind == "mixed":
        return BatchShape.mixed(
            r.num_new_tokens,
            r.num_cached_tokens,
            r.decode_batch_size,
            r.decode_context_len,
            r.block_size,
        )
    if kind == "multi" and r.num_entries > 1:
        k = r.num_entries
        return BatchShape(
            r.block_size,
            k * r.num_new_tokens,
            prefill_new_tokens=[r.num_new_tokens] * k,
            prefill_context_tokens=[r.num_cached_tokens] * k,
        )
    return None
