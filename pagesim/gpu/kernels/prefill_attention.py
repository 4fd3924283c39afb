"""Paged attention for prefill, chunked prefill and mixed steps (variable-length queries).

    sequence s owns query rows  query_start_loc[s] .. query_start_loc[s+1]-1   (q_len_s tokens)
    its context is              seq_lens[s] tokens, the last q_len_s of them the new ones
    new token i of s sits at    position ctx_len_s + i,  ctx_len_s = seq_lens[s] - q_len_s
    and attends causally to     positions max(0, pos - W + 1) .. pos   (W = sliding window)

A decode is a sequence with `q_len == 1`, so one launch serves a step that mixes prefill
chunks (with or without a cached prefix) and decodes. K/V of the new tokens must already be in
the cache (`reshape_and_cache` first): every key is read through the block table.

Grid `(num_q_blocks, num_kv_heads)`. A program takes `BLOCK_Q` query tokens of one sequence
times the `QUERIES_PER_KV` query heads of one KV head (`BLOCK_M = BLOCK_Q * QUERIES_PER_KV`
rows, row r = token r // QUERIES_PER_KV, head r % QUERIES_PER_KV), so each K/V tile is read once
per group. Query blocks are numbered without a host-side table: sequence s owns program ids
from `query_start_loc[s] // BLOCK_Q + s` on, which leaves room for its
`cdiv(q_len_s, BLOCK_Q)` blocks; a program finds its sequence by binary search and surplus
programs exit. The launch therefore needs only `num_tokens` and `num_seqs`, known on the host.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pagesim.gpu.kernels.arch import device_arch
from pagesim.gpu.kernels.checks import (
    attention_output,
    check_attention_inputs,
    check_index_tensors,
    check_same_device,
    check_shape,
    check_sliding_window,
)
from pagesim.gpu.kernels.configs import KernelConfig, prefill_config
from pagesim.gpu.kernels.paged_attention import (
    LOG2E,
    PagedContext,
    attention_meta,
    attention_strides,
)


@triton.jit
def _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest s with query_start_loc[s] // BLOCK_Q + s <= q_block (binary search)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_tiles(
    acc,
    m_i,
    l_i,  # running output [BLOCK_M, HEAD_SIZE], max and sum [BLOCK_M] (fp32)
    q,
    q_pos,  # [BLOCK_M, HEAD_SIZE] queries and [BLOCK_M] their absolute positions
    bt_row,
    k_base,
    v_base,  # block-table row of the sequence; caches at this KV head
    start_lo,
    start_hi,
    hi,  # tiles start in [start_lo, start_hi); keys < hi exist
    qk_scale,
    sliding_window,  #
    stride_kc_blk,
    stride_kc_off,
    stride_vc_blk,
    stride_vc_off,  #
    HEAD_SIZE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,  #
    MASKED: tl.constexpr,  # False: the caller guarantees every row sees every key
    USE_WINDOW: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  #
):
    """Online-softmax update over a run of context tiles (the flash-attention inner loop)."""
    d = tl.arange(0, HEAD_SIZE)
    offs_t = tl.arange(0, TILE_N)
    for start in range(start_lo, start_hi, TILE_N):
        t = start + offs_t
        t_mask = t < hi
        if BLOCK_SIZE >= TILE_N:  # the tile lies in one cache block
            blk = tl.load(bt_row + start // BLOCK_SIZE).to(tl.int64)
        elif MASKED:
            blk = tl.load(bt_row + t // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        else:
            blk = tl.load(bt_row + t // BLOCK_SIZE).to(tl.int64)
        off = t % BLOCK_SIZE
        k_ptrs = k_base + (blk * stride_kc_blk + off * stride_kc_off)[:, None] + d[None, :]
        v_ptrs = v_base + (blk * stride_vc_blk + off * stride_vc_off)[:, None] + d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=t_mask[:, None], other=0.0)  # [TILE_N, HEAD_SIZE]
            v = tl.load(v_ptrs, mask=t_mask[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale  # [BLOCK_M, TILE_N]
        if MASKED:
            visible = t_mask[None, :] & (t[None, :] <= q_pos[:, None])  # causal
            if USE_WINDOW:
                visible = visible & (q_pos[:, None] - t[None, :] < sliding_window)
            s = tl.where(visible, s, float("-inf"))
        # A row may see nothing in a masked tile (window edge, padding): keep its max finite.
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit(do_not_specialize=["num_seqs", "sliding_window"])
def _paged_prefill_kernel(
    out_ptr,  # [num_tokens, num_heads, head_size]
    query_ptr,  # [num_tokens, num_heads, head_size]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_table_ptr,  # [num_seqs, max_num_blocks_per_seq]
    seq_lens_ptr,  # [num_seqs]
    query_start_loc_ptr,  # [num_seqs + 1]
    qk_scale,  # softmax scale * log2(e)
    num_seqs,  #
    sliding_window,  # tokens each query sees (itself included), read when USE_WINDOW
    stride_q_tok: tl.int64,
    stride_q_head: tl.int64,  #
    stride_o_tok: tl.int64,
    stride_o_head: tl.int64,  #
    stride_kc_blk: tl.int64,
    stride_kc_off: tl.int64,
    stride_kc_head: tl.int64,  #
    stride_vc_blk: tl.int64,
    stride_vc_off: tl.int64,
    stride_vc_head: tl.int64,  #
    stride_bt_seq: tl.int64,  #
    QUERIES_PER_KV: tl.constexpr,  #
    BLOCK_Q: tl.constexpr,  # query tokens per program
    BLOCK_M: tl.constexpr,  # rows per program, a power of two >= BLOCK_Q * QUERIES_PER_KV
    HEAD_SIZE: tl.constexpr,  #
    BLOCK_SIZE: tl.constexpr,  #
    TILE_N: tl.constexpr,  # context tokens per iteration
    USE_WINDOW: tl.constexpr,  # sliding_window applies
    DOT_PRECISION: tl.constexpr,  #
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local = q_block - (q_start // BLOCK_Q + seq)  # this program's block within the sequence
    if local * BLOCK_Q >= q_len:  # surplus program
        return
    seq_len = tl.load(seq_lens_ptr + seq.to(tl.int64)).to(tl.int32)
    ctx_len = seq_len - q_len  # cached prefix (earlier chunks or a prefix-cache hit)

    rows = tl.arange(0, BLOCK_M)
    q_idx = local * BLOCK_Q + rows // QUERIES_PER_KV  # query token within the sequence
    heads = kv_head * QUERIES_PER_KV + rows % QUERIES_PER_KV
    row_mask = (rows // QUERIES_PER_KV < BLOCK_Q) & (q_idx < q_len)
    q_pos = ctx_len + q_idx  # absolute position of each row's token
    tok = (q_start + q_idx).to(tl.int64)
    d = tl.arange(0, HEAD_SIZE)
    q = tl.load(
        query_ptr + tok[:, None] * stride_q_tok + heads[:, None] * stride_q_head + d[None, :],
        mask=row_mask[:, None],
        other=0.0,
    )  # [BLOCK_M, HEAD_SIZE]

    # Keys this block can see: up to its last token (causal), from its first token's window.
    # Three runs of tiles (starts are multiples of TILE_N):
    #   [a, b)   window edge: some rows already past some keys          -> masked
    #   [b, c)   every row sees every key (t <= first_pos, in window)   -> no mask
    #   [c, hi)  the diagonal: causal mask                              -> masked
    first_pos = ctx_len + local * BLOCK_Q
    last_pos = first_pos + BLOCK_Q - 1  # of the block's rows, padding rows included
    hi = tl.minimum(seq_len, last_pos + 1)
    a = 0
    b = 0
    if USE_WINDOW:
        a = (tl.maximum(first_pos - sliding_window + 1, 0) // TILE_N) * TILE_N
        b = tl.cdiv(tl.maximum(last_pos - sliding_window + 1, 0), TILE_N) * TILE_N
        b = tl.maximum(b, a)
    c = tl.maximum(((first_pos + 1) // TILE_N) * TILE_N, b)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_SIZE], dtype=tl.float32)
    bt_row = block_table_ptr + seq.to(tl.int64) * stride_bt_seq
    k_base = key_cache_ptr + kv_head * stride_kc_head
    v_base = value_cache_ptr + kv_head * stride_vc_head
    for run in tl.static_range(3):  # unrolled: each run is compiled with its own MASKED
        start_lo = a if run == 0 else (b if run == 1 else c)
        start_hi = tl.minimum(b, hi) if run == 0 else (c if run == 1 else hi)
        acc, m_i, l_i = _attend_tiles(
            acc,
            m_i,
            l_i,
            q,
            q_pos,
            bt_row,
            k_base,
            v_base,
            start_lo,
            start_hi,
            hi,
            qk_scale,
            sliding_window,
            stride_kc_blk,
            stride_kc_off,
            stride_vc_blk,
            stride_vc_off,
            HEAD_SIZE,
            BLOCK_SIZE,
            TILE_N,
            run != 1,
            USE_WINDOW,
            DOT_PRECISION,
        )

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + tok[:, None] * stride_o_tok + heads[:, None] * stride_o_head + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None],
    )


def paged_attention_prefill(
    query: torch.Tensor,  # [num_tokens, num_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    block_table: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32/int64
    seq_lens: torch.Tensor,  # [num_seqs], context length incl. this step's tokens
    query_start_loc: torch.Tensor,  # [num_seqs + 1], prefix sums of query lengths
    scale: float | None = None,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix plus themselves.

    Rows past `query_start_loc[-1]` (batch padding) are not written. No host sync happens
    here. Returns `out`, `[num_tokens, num_heads, head_size]` in the query's dtype.
    """
    block_size, num_kv_heads, head_size, group = check_attention_inputs(
        query, key_cache, value_cache
    )
    num_tokens = query.shape[0]
    check_shape("block_table", block_table, (None, None))
    num_seqs = block_table.shape[0]
    check_shape("seq_lens", seq_lens, (num_seqs,))
    check_shape("query_start_loc", query_start_loc, (num_seqs + 1,))
    check_index_tensors(block_table=block_table, seq_lens=seq_lens, query_start_loc=query_start_loc)
    window = check_sliding_window(sliding_window)
    out = attention_output(out, query)
    check_same_device(
        query=query,
        key_cache=key_cache,
        block_table=block_table,
        seq_lens=seq_lens,
        query_start_loc=query_start_loc,
        out=out,
    )
    if num_seqs == 0 or num_tokens == 0:
        return out
    cfg = config or prefill_config(
        head_size, group, query.is_cuda, query.dtype == torch.float32, device_arch(query.device)
    )
    block_q = cfg.block_m // group
    # Upper bound on the query blocks of all sequences (see the module docstring).
    num_q_blocks = num_tokens // block_q + num_seqs
    scale = 1.0 / math.sqrt(head_size) if scale is None else scale
    context = PagedContext(key_cache, value_cache, block_table, seq_lens)
    _paged_prefill_kernel[(num_q_blocks, num_kv_heads)](
        out,
        query,
        *context,
        query_start_loc,
        scale * LOG2E,
        num_seqs,
        window,
        *attention_strides(query, out, context),
        BLOCK_Q=block_q,
        **attention_meta(cfg, group, key_cache, window),
    )
    return out
