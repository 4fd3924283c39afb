"""Launch parameters for the attention kernels, chosen from the shape by rule (no autotuning).

Rules rather than `triton.autotune` so that the same choice is made on a CPU under
`TRITON_INTERPRET=1` (where autotuning with several configs cannot run) and on the GPU, and so
that a step's choice is known before a CUDA graph is captured.

Decode split-K picture (one program per (sequence, KV head, partition)):

    context of seq s:  |--- part 0 ---|--- part 1 ---|--- part 2 -|       (partition_size tokens)
    programs:              (s,h,0)        (s,h,1)       (s,h,2)        -> partial (max, sum, out)
    reduction:         one program per (s, query head) rescales the partials by exp(max_p - max)

Splitting pays when `num_seqs * num_kv_heads` programs cannot fill the GPU (small batches with
long contexts); with enough programs it only adds the reduction's traffic, so it is skipped.
"""

from __future__ import annotations

from typing import NamedTuple

import triton

#: Programs per SM the decode split aims for (enough loads in flight to hide HBM latency).
DECODE_PROGRAMS_PER_SM = 4
#: Fewest context tokens a decode partition is given (below this the reduction dominates).
MIN_PARTITION_TOKENS = 256
#: Most partitions per sequence (the reduction holds all of them in one tile).
MAX_PARTITIONS = 64


class KernelConfig(NamedTuple):
    """Tile shape and launch width of one attention kernel launch."""

    block_m: int  # query rows per program (query tokens x query heads of one KV head)
    tile_n: int  # context tokens per loop iteration
    num_warps: int
    num_stages: int


class DecodePartition(NamedTuple):
    """How a decode step splits each context: `num_partitions == 1` means no split."""

    num_partitions: int
    partition_size: int  # tokens per partition, a multiple of the decode tile


def decode_config(head_size: int, num_queries_per_kv: int, on_gpu: bool) -> KernelConfig:
    """Decode: all query heads of one KV head in one program, padded to the 16-row dot minimum.

    On the GPU the tile holds 64 tokens of K (16 KiB at head size 128, fp16) so that two or
    three tiles in flight per program cover HBM latency; 32 at head size 256 to keep registers.
    On the CPU interpreter small tiles keep the tests quick.
    """
    block_m = max(16, triton.next_power_of_2(num_queries_per_kv))
    if not on_gpu:
        return KernelConfig(block_m, 16, 1, 1)
    tile_n = 32 if head_size > 128 else 64
    return KernelConfig(block_m, tile_n, 4, 3)


def prefill_config(head_size: int, num_queries_per_kv: int, on_gpu: bool,
                   fp32: bool = False) -> KernelConfig:
    """Prefill: `block_m` rows = `block_m // num_queries_per_kv` query tokens x their heads.

    GPU tiles follow the flash-attention tutorial's Hopper choice for head size <= 128
    (128 x 64, 8 warps); head size 256 halves the query tile to stay within registers. fp32
    inputs (exact IEEE dots, no tensor cores; tests only) get small tiles that do not spill.
    """
    floor = max(16, triton.next_power_of_2(num_queries_per_kv))
    if not on_gpu:
        return KernelConfig(floor, 16, 1, 1)
    if fp32:
        return KernelConfig(max(32, floor), 32, 4, 1)
    if head_size > 128:
        return KernelConfig(max(64, floor), 32, 4, 2)
    return KernelConfig(max(128, floor), 64, 8, 3)


def decode_partition(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    tile_n: int,
    num_sms: int,
    sliding_window: int | None = None,
    min_partition_tokens: int = MIN_PARTITION_TOKENS,
) -> DecodePartition:
    """Split each context into partitions when `num_seqs * num_kv_heads` cannot fill the GPU.

    `max_seq_len` is the longest context of the step (tokens, new token included); with a
    sliding window only the last `sliding_window` tokens are read, so that length counts.
    """
    span = max(1, min(max_seq_len, sliding_window) if sliding_window else max_seq_len)
    programs = max(1, num_seqs * num_kv_heads)
    wanted = triton.cdiv(DECODE_PROGRAMS_PER_SM * num_sms, programs)
    splits = max(1, min(wanted, triton.cdiv(span, min_partition_tokens), MAX_PARTITIONS))
    if splits == 1:
        return DecodePartition(1, triton.cdiv(span, tile_n) * tile_n)
    return fixed_partition(span, triton.cdiv(span, splits), tile_n)


def fixed_partition(span: int, partition_size: int, tile_n: int) -> DecodePartition:
    """Partitions of about `partition_size` tokens (rounded up to the tile) over `span` tokens."""
    size = max(tile_n, triton.cdiv(partition_size, tile_n) * tile_n)
    return DecodePartition(max(1, triton.cdiv(span, size)), size)
