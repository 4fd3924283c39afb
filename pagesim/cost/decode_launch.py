"""The decode attention kernel's launch rule: how a step's contexts are split into partitions.

One rule, two users: the GPU backend launches the split-K decode kernel with it
(`pagesim.gpu.kernels.configs.decode_partition` passes its kernel config here), and the cost
model prices decode steps with it (`pagesim.cost.corrections.spread`), so both agree on the
programs a step runs without the cost model importing torch or triton.

A decode step runs one program per (sequence, KV head, partition); a graph step's partitions
are chosen for its span bucket (the longest context rounded up to a power of two,
`span_bucket`), an eager step's for its longest context.
"""

from __future__ import annotations

from typing import NamedTuple

#: Fewest context tokens a decode partition is given (below this the reduction dominates).
MIN_PARTITION_TOKENS = 128
#: Most partitions per sequence (the reduction holds all of them in one tile).
MAX_PARTITIONS = 64
#: Per-program fixed cost of a decode program, in tile iterations (prologue, q load, epilogue).
PROGRAM_OVERHEAD_TILES = 1
#: Cost of a split's reduction kernel (a second launch plus the partials), in tile iterations.
REDUCTION_COST_TILES = 2
#: Smallest span a decode graph is captured for (tokens).
MIN_SPAN_BUCKET = 256


class DecodePartition(NamedTuple):
    """How a decode step splits each context: `num_partitions == 1` means no split."""

    num_partitions: int
    partition_size: int  # tokens per partition, a multiple of the decode tile


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints. Not `triton.cdiv`: on some Triton versions that
    is a JIT function whose every host call goes through the launcher's argument handling."""
    return -(-a // b)


def fixed_partition(span: int, partition_size: int, tile_n: int) -> DecodePartition:
    """Partitions of about `partition_size` tokens (rounded up to the tile) over `span` tokens."""
    size = max(tile_n, cdiv(partition_size, tile_n) * tile_n)
    return DecodePartition(max(1, cdiv(span, size)), size)


def partition_cuts(part: DecodePartition, seq_len: int) -> tuple[int, ...]:
    """Token offsets at which a context of `seq_len` tokens is cut into partitions.

    Partitions past a context's end exit at once, so two partitions with the same cuts sum
    the same tokens in the same order (bit-identical outputs), and two with different cuts
    sum in another order (outputs that can differ in rounding)."""
    if part.num_partitions == 1:
        return ()
    return tuple(range(part.partition_size, seq_len, part.partition_size))


def split_rule(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    tile_n: int,
    programs_per_sm: int,
    num_sms: int,
    sliding_window: int | None = None,
    min_partition_tokens: int = MIN_PARTITION_TOKENS,
) -> DecodePartition:
    """Split contexts so that `num_seqs * num_kv_heads * splits` programs fill the GPU evenly.

    Cost model (wave quantisation): with `slots = num_sms * programs_per_sm` programs
    resident at once, `s` splits take `ceil(programs * s / slots)` waves, each as long as one
    program's `ceil(span / s / tile_n)` tiles plus a fixed overhead, and any split adds the
    reduction. The cheapest `s` wins, fewer partitions on ties (8 splits, not 9, for 64
    programs of 8192 tokens: one wave instead of a second, nearly empty one); how it compares
    with the measured fastest split: docs/cost_model.md.
    `max_seq_len` is the longest context of the step (tokens, new token included); with a
    sliding window only the last `sliding_window` tokens are read, so that length counts.
    """
    span = max(1, min(max_seq_len, sliding_window) if sliding_window else max_seq_len)
    programs = max(1, num_seqs * num_kv_heads)
    slots = max(1, num_sms * programs_per_sm)
    most = max(1, min(MAX_PARTITIONS, cdiv(span, min_partition_tokens)))
    best, best_cost = 1, None
    for s in range(1, most + 1):
        part = fixed_partition(span, cdiv(span, s), tile_n)
        if part.num_partitions != s:  # rounding to the tile merged partitions
            continue
        waves = cdiv(programs * s, slots)
        cost = waves * (part.partition_size // tile_n + PROGRAM_OVERHEAD_TILES)
        cost += REDUCTION_COST_TILES if s > 1 else 0
        if best_cost is None or cost < best_cost:
            best, best_cost = s, cost
    return fixed_partition(span, cdiv(span, best), tile_n)


def span_bucket(max_seq_len: int, max_model_len: int) -> int:
    """The step's longest context rounded up to a power of two, within
    [MIN_SPAN_BUCKET, max_model_len] (never below `max_seq_len`): what a decode graph is
    captured for."""
    b = max(MIN_SPAN_BUCKET, 1 << max(0, max_seq_len - 1).bit_length())
    return max(max_seq_len, min(b, max_model_len))
