"""Launch parameters for the attention kernels, chosen from the shape by rule (no autotuning).

Rules rather than `triton.autotune` so that the same choice is made on a CPU under
`TRITON_INTERPRET=1` (where autotuning with several configs cannot run) and on the GPU, and so
that a step's choice is known before a CUDA graph is captured.

Decode split-K picture (one program per (sequence, KV head, partition)):

    context of seq s:  |--- part 0 ---|--- part 1 ---|--- part 2 -|       (partition_size tokens)
    programs:              (s,h,0)        (s,h,1)       (s,h,2)        -> partial (max, sum, out)
    reduction:         one program per (s, query head) rescales the partials by exp(max_p - max)

Splitting pays when `num_seqs * num_kv_heads` programs cannot fill the GPU (small batches with
long contexts); `decode_partition` picks the split count by counting waves of resident
programs, so that it neither leaves SMs idle nor starts a second, mostly empty wave.
"""

from __future__ import annotations

from typing import NamedTuple

import triton

from pagesim.cost.decode_launch import (
    MAX_PARTITIONS,
    MIN_PARTITION_TOKENS,
    PROGRAM_OVERHEAD_TILES,
    REDUCTION_COST_TILES,
    DecodePartition,
    cdiv,
    fixed_partition,
    split_rule,
)
from pagesim.gpu.kernels.arch import SM90, Arch, decode_programs_per_sm, shared_bytes

__all__ = [
    "MAX_PARTITIONS",
    "MIN_PARTITION_TOKENS",
    "PROGRAM_OVERHEAD_TILES",
    "REDUCTION_COST_TILES",
    "DecodePartition",
    "KernelConfig",
    "cdiv",
    "decode_config",
    "decode_partition",
    "fixed_partition",
    "prefill_config",
]


class KernelConfig(NamedTuple):
    """Tile shape and launch width of one attention kernel launch."""

    block_m: int  # query rows per program (query tokens x query heads of one KV head)
    tile_n: int  # context tokens per loop iteration
    num_warps: int
    num_stages: int
    # Programs of this config resident on one SM at once (registers and shared memory from
    # the sm_90 compiler report); the decode split counts waves with it.
    programs_per_sm: int = 1


def decode_config(
    head_size: int, num_queries_per_kv: int, on_gpu: bool, arch: Arch = SM90
) -> KernelConfig:
    """Decode: all query heads of one KV head in one program, padded to the 16-row dot minimum.

    Tiles timed on an H200 (`benchmarks/attention.py`, results/attention_h200*.csv): 64 tokens
    a tile beat 128 with 8 warps where bandwidth rules. Programs per SM are the compiler's
    report on sm_90, capped on another SM (`arch`) by its shared memory
    (`arch.decode_programs_per_sm`; not timed there). The CPU interpreter gets small tiles.
    """
    block_m = max(16, triton.next_power_of_2(num_queries_per_kv))
    if not on_gpu:
        return KernelConfig(block_m, 16, 1, 1, 1)
    if head_size > 128:
        warps, stages, per_sm = 8, 2, 2
    elif head_size < 128:
        warps, stages, per_sm = 4, 3, 7
    else:
        warps, stages, per_sm = 4, 3, 4
    return KernelConfig(block_m, 64, warps, stages, decode_programs_per_sm(head_size, per_sm, arch))


def prefill_config(
    head_size: int,
    num_queries_per_kv: int,
    on_gpu: bool,
    fp32: bool = False,
    arch: Arch = SM90,
) -> KernelConfig:
    """Prefill: `block_m` rows = `block_m // num_queries_per_kv` query tokens x their heads.

    GPU tiles follow the flash-attention tutorial's Hopper choice for head size <= 128 (a
    sweep on an H200 agreed); head size 256 halves the query tile to stay within registers.
    fp32 inputs (exact IEEE dots, no tensor cores; tests only) get small tiles that do not
    spill. On an SM with less shared memory (`arch`) the first choice whose bound
    (`arch.shared_bytes`) fits is taken: smaller query tiles, then fewer stages (not timed).
    """
    floor = max(16, triton.next_power_of_2(num_queries_per_kv))
    if not on_gpu:
        return KernelConfig(floor, 16, 1, 1)
    if fp32:
        return KernelConfig(max(32, floor), 32, 4, 1)
    if head_size > 128:
        choices = ((max(64, floor), 32, 4, 2), (max(32, floor), 32, 4, 2), (floor, 32, 4, 1))
    else:
        choices = (
            (max(128, floor), 64, 8, 3),
            (max(128, floor), 64, 8, 2),
            (max(64, floor), 64, 4, 2),
            (max(32, floor), 32, 4, 2),
        )
    for m, n, warps, stages in choices:
        if shared_bytes(m, n, head_size, stages) <= arch.shared_per_block_bytes:
            return KernelConfig(m, n, warps, stages)
    return KernelConfig(floor, 16, 4, 1)


def decode_partition(
    num_seqs: int,
    num_kv_heads: int,
    max_seq_len: int,
    config: KernelConfig,
    num_sms: int,
    sliding_window: int | None = None,
    min_partition_tokens: int = MIN_PARTITION_TOKENS,
) -> DecodePartition:
    """The decode split for this kernel config: `pagesim.cost.decode_launch.split_rule`
    (shared with the cost model, which prices steps with the same partitions)."""
    return split_rule(
        num_seqs,
        num_kv_heads,
        max_seq_len,
        config.tile_n,
        config.programs_per_sm,
        num_sms,
        sliding_window,
        min_partition_tokens,
    )
