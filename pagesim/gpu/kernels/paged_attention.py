"""Paged attention for decode: one query token per sequence, context read through block tables.

    query[s]         [num_heads, head_size]       (the new token of sequence s)
    context of s     positions 0 .. seq_lens[s]-1 (the new token's K/V already written)
    K/V of pos p     key_cache[block_table[s, p // block_size], p % block_size, kv_head]

Grid `(num_seqs, num_kv_heads, num_partitions)`. A program takes every query head of its KV
head (GQA/MQA: `num_heads // num_kv_heads` rows, padded to the 16-row `tl.dot` minimum), so
each K/V tile is read from memory once for the whole group. It walks its partition of the
context in tiles of `TILE_N` tokens with an online softmax (running max `m`, running sum `l`,
fp32 accumulator). Unsplit, it writes the normalised output; split, it writes `(m, l, out)` per
partition and `_paged_decode_reduce_kernel` merges them:

    M = max_p m_p,   w_p = l_p * 2^(m_p - M),   out = sum_p w_p * out_p / sum_p w_p

Logits are kept in base 2 (`qk_scale = scale * log2(e)`), so the kernels call `exp2`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from pagesim.gpu.kernels.arch import device_arch
from pagesim.gpu.kernels.checks import (
    attention_output,
    check_attention_inputs,
    check_contiguous,
    check_index_tensors,
    check_same_device,
    check_shape,
    check_sliding_window,
)
from pagesim.gpu.kernels.configs import DecodePartition, KernelConfig, decode_config

LOG2E = 1.4426950408889634


class PagedContext(NamedTuple):
    """What the queries attend over, as the decode and prefill kernels take it (four
    consecutive arguments): the caches, and per sequence its block-table row and context
    length."""

    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    block_table: torch.Tensor  # [num_seqs, max_num_blocks_per_seq]
    seq_lens: torch.Tensor  # [num_seqs]


def attention_strides(
    query: torch.Tensor, out: torch.Tensor, context: PagedContext
) -> tuple[int, ...]:
    """The stride arguments of the decode and prefill kernels, in their signatures' order."""
    return (
        *query.stride()[:2],
        *out.stride()[:2],
        *context.key_cache.stride()[:3],
        *context.value_cache.stride()[:3],
        context.block_table.stride(0),
    )


def attention_meta(
    cfg: KernelConfig, group: int, key_cache: torch.Tensor, window: int
) -> dict[str, object]:
    """The compile-time arguments and launch options both attention kernels take."""
    return {
        "QUERIES_PER_KV": group,
        "BLOCK_M": cfg.block_m,
        "HEAD_SIZE": key_cache.shape[3],
        "BLOCK_SIZE": key_cache.shape[1],
        "TILE_N": cfg.tile_n,
        "USE_WINDOW": window > 0,
        "DOT_PRECISION": "ieee" if key_cache.dtype == torch.float32 else "tf32",
        "num_warps": cfg.num_warps,
        "num_stages": cfg.num_stages,
    }


@triton.jit(do_not_specialize=["partition_size", "max_parts", "sliding_window"])
def _paged_decode_kernel(
    out_ptr,  # [num_seqs, num_heads, head_size]          (written when unsplit)
    part_out_ptr,  # [num_seqs, num_heads, max_parts, head_size] fp32 (written when split)
    part_max_ptr,  # [num_seqs, num_heads, max_parts] fp32, base-2 running max
    part_sum_ptr,  # [num_seqs, num_heads, max_parts] fp32, running sum of 2^(s - max)
    query_ptr,  # [num_seqs, num_heads, head_size]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_table_ptr,  # [num_seqs, max_num_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    qk_scale,  # softmax scale * log2(e)
    partition_size,  # tokens per partition (a multiple of TILE_N)
    max_parts,  # third dim of part_* buffers
    sliding_window,  # tokens each query sees (itself included), read when USE_WINDOW
    stride_q_seq: tl.int64,
    stride_q_head: tl.int64,  #
    stride_o_seq: tl.int64,
    stride_o_head: tl.int64,  #
    stride_kc_blk: tl.int64,
    stride_kc_off: tl.int64,
    stride_kc_head: tl.int64,  #
    stride_vc_blk: tl.int64,
    stride_vc_off: tl.int64,
    stride_vc_head: tl.int64,  #
    stride_bt_seq: tl.int64,  #
    QUERIES_PER_KV: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,  # QUERIES_PER_KV padded to a power of two >= 16
    HEAD_SIZE: tl.constexpr,  #
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE_N: tl.constexpr,  # context tokens per iteration
    USE_WINDOW: tl.constexpr,  # sliding_window applies
    SPLIT: tl.constexpr,  # write partials instead of the final output
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, else "tf32" (ignored by fp16/bf16)
):
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    part = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    kv_start = 0
    if USE_WINDOW:  # the new token (position seq_len-1) sees the last W positions
        kv_start = tl.maximum(seq_len - sliding_window, 0)
    lo = kv_start
    hi = seq_len
    if SPLIT:
        lo = kv_start + part * partition_size
        hi = tl.minimum(lo + partition_size, seq_len)
        if lo >= seq_len:  # this sequence needs fewer partitions; the reduction skips it
            return

    rows = tl.arange(0, BLOCK_M)
    heads = kv_head * QUERIES_PER_KV + rows  # query heads of this KV group
    row_mask = rows < QUERIES_PER_KV
    d = tl.arange(0, HEAD_SIZE)
    q = tl.load(
        query_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )  # [BLOCK_M, HEAD_SIZE], stays in registers

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE], dtype=tl.float32)
    bt_row = block_table_ptr + seq * stride_bt_seq
    k_base = key_cache_ptr + kv_head * stride_kc_head
    v_base = value_cache_ptr + kv_head * stride_vc_head
    offs_t = tl.arange(0, TILE_N)

    # Tiles start at multiples of TILE_N so that, when BLOCK_SIZE >= TILE_N, a tile lies in one
    # cache block; the first tile masks positions before `lo`. Every tile has >= 1 valid token.
    for start in range((lo // TILE_N) * TILE_N, hi, TILE_N):
        t = start + offs_t
        t_mask = (t >= lo) & (t < hi)
        if BLOCK_SIZE >= TILE_N:  # one block id for the whole tile
            blk = tl.load(bt_row + start // BLOCK_SIZE).to(tl.int64)
        else:  # one block id per token (a tile spans TILE_N // BLOCK_SIZE blocks)
            blk = tl.load(bt_row + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        off = t % BLOCK_SIZE
        k_rows = blk * stride_kc_blk + off * stride_kc_off  # [TILE_N] element offsets
        v_rows = blk * stride_vc_blk + off * stride_vc_off
        k = tl.load(k_base + k_rows[:, None] + d[None, :], mask=t_mask[:, None], other=0.0)
        v = tl.load(v_base + v_rows[:, None] + d[None, :], mask=t_mask[:, None], other=0.0)

        # -- logits and online-softmax update (base 2)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: the tile has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if SPLIT:
        part_row = (seq * tl.num_programs(1) * QUERIES_PER_KV + heads) * max_parts + part
        tl.store(part_max_ptr + part_row, m_i, mask=row_mask)
        tl.store(part_sum_ptr + part_row, l_i, mask=row_mask)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_SIZE + d[None, :], out, mask=row_mask[:, None]
        )
    else:  # seq_len == 0 (a padded sequence) leaves l_i == 0: write zeros, not NaN
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None],
        )


@triton.jit(do_not_specialize=["partition_size", "max_parts", "sliding_window"])
def _paged_decode_reduce_kernel(
    out_ptr,  # [num_seqs, num_heads, head_size]
    part_out_ptr,  # [num_seqs, num_heads, max_parts, head_size] fp32
    part_max_ptr,  # [num_seqs, num_heads, max_parts] fp32
    part_sum_ptr,  # [num_seqs, num_heads, max_parts] fp32
    seq_lens_ptr,  # [num_seqs]
    partition_size,  #
    max_parts,  #
    sliding_window,  #
    stride_o_seq: tl.int64,
    stride_o_head: tl.int64,  #
    HEAD_SIZE: tl.constexpr,  #
    USE_WINDOW: tl.constexpr,  #
    PARTS_P2: tl.constexpr,  # max_parts rounded up to a power of two
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    span = seq_len
    if USE_WINDOW:
        span = tl.minimum(seq_len, sliding_window)
    num_parts = tl.cdiv(span, partition_size)  # partitions the decode kernel wrote

    p = tl.arange(0, PARTS_P2)
    p_mask = p < num_parts
    row = (seq * tl.num_programs(1) + head) * max_parts
    m = tl.load(part_max_ptr + row + p, mask=p_mask, other=float("-inf"))
    l_p = tl.load(part_sum_ptr + row + p, mask=p_mask, other=0.0)
    m_all = tl.max(m, axis=0)
    m_all = tl.where(m_all > float("-inf"), m_all, 0.0)  # no partition (empty sequence)
    w = tl.where(p_mask, l_p * tl.exp2(m - m_all), 0.0)
    d = tl.arange(0, HEAD_SIZE)
    o = tl.load(
        part_out_ptr + (row + p)[:, None] * HEAD_SIZE + d[None, :], mask=p_mask[:, None], other=0.0
    )
    denom = tl.sum(w, axis=0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + seq * stride_o_seq + head * stride_o_head + d, out.to(out_ptr.dtype.element_ty)
    )


class DecodeWorkspace(NamedTuple):
    """fp32 partials of a split decode; allocate once per step, reuse in every layer."""

    part_out: torch.Tensor  # [num_seqs, num_heads, num_partitions, head_size]
    part_max: torch.Tensor  # [num_seqs, num_heads, num_partitions]
    part_sum: torch.Tensor  # [num_seqs, num_heads, num_partitions]

    @classmethod
    def allocate(
        cls,
        num_seqs: int,
        num_heads: int,
        head_size: int,
        num_partitions: int,
        device: torch.device | str,
    ) -> DecodeWorkspace:
        shape = (num_seqs, num_heads, num_partitions)
        return cls(
            torch.empty((*shape, head_size), dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device),
            torch.empty(shape, dtype=torch.float32, device=device),
        )


def paged_attention_decode(
    query: torch.Tensor,  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_table: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32/int64
    seq_lens: torch.Tensor,  # [num_seqs] int32/int64, context length incl. the new token
    partition: DecodePartition,
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    workspace: DecodeWorkspace | None = None,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over its paged context.

    `partition` comes from `configs.decode_partition` (it needs the step's longest context, a
    host-side number, so the caller computes it once per step). No host sync happens here, so
    the call can be captured in a CUDA graph when `out` and `workspace` are given.
    Returns `out`, `[num_seqs, num_heads, head_size]` in the query's dtype.
    """
    block_size, num_kv_heads, head_size, group = check_attention_inputs(
        query, key_cache, value_cache
    )
    num_seqs, num_heads, _ = query.shape
    check_shape("block_table", block_table, (num_seqs, None))
    check_shape("seq_lens", seq_lens, (num_seqs,))
    check_index_tensors(block_table=block_table, seq_lens=seq_lens)
    window = check_sliding_window(sliding_window)
    out = attention_output(out, query)
    check_same_device(
        query=query, key_cache=key_cache, block_table=block_table, seq_lens=seq_lens, out=out
    )
    cfg = config or decode_config(head_size, group, query.is_cuda, device_arch(query.device))
    split = partition.num_partitions > 1
    if split and workspace is None:
        workspace = DecodeWorkspace.allocate(
            num_seqs, num_heads, head_size, partition.num_partitions, query.device
        )
    if split:
        check_shape(
            "workspace.part_out",
            workspace.part_out,
            (num_seqs, num_heads, partition.num_partitions, head_size),
        )
        check_contiguous("workspace.part_out", workspace.part_out)
    parts = workspace if split else (out, out, out)  # unused pointers when unsplit
    if num_seqs == 0:
        return out
    scale = 1.0 / math.sqrt(head_size) if scale is None else scale
    context = PagedContext(key_cache, value_cache, block_table, seq_lens)
    _paged_decode_kernel[(num_seqs, num_kv_heads, partition.num_partitions)](
        out,
        *parts,
        query,
        *context,
        scale * LOG2E,
        partition.partition_size,
        partition.num_partitions,
        window,
        *attention_strides(query, out, context),
        SPLIT=split,
        **attention_meta(cfg, group, key_cache, window),
    )
    if split:
        _paged_decode_reduce_kernel[(num_seqs, num_heads)](
            out,
            *workspace,
            seq_lens,
            partition.partition_size,
            partition.num_partitions,
            window,
            out.stride(0),
            out.stride(1),
            HEAD_SIZE=head_size,
            USE_WINDOW=window > 0,
            PARTS_P2=triton.next_power_of_2(partition.num_partitions),
            num_warps=4 if query.is_cuda else 1,
        )
    return out
