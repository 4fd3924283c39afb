"""Plain torch references of the paged-KV Triton kernels, for the kernel tests."""

from __future__ import annotations

import math

import torch
import triton


def gather_kv(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first `seq_len` tokens of one sequence, `[seq_len, num_kv_heads, head_size]`."""
    block_size = cache.shape[1]
    blocks = block_row[: triton.cdiv(seq_len, block_size)].to(torch.int64)
    return cache[blocks].flatten(0, 1)[:seq_len]


def paged_attention_decode_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain fp32 attention of each sequence's query over K/V gathered through the block table."""
    num_seqs, num_heads, head_size = query.shape
    group = num_heads // key_cache.shape[2]
    scale = 1.0 / math.sqrt(head_size) if scale is None else scale
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        lo = max(0, n - sliding_window) if sliding_window else 0
        if n == 0:
            continue
        k = gather_kv(key_cache, block_table[s], n)[lo:].float().repeat_interleave(group, 1)
        v = gather_kv(value_cache, block_table[s], n)[lo:].float().repeat_interleave(group, 1)
        logits = torch.einsum("hd,khd->hk", query[s].float(), k) * scale
        out[s] = torch.einsum("hk,khd->hd", logits.softmax(-1), v)
    return out


def paged_attention_prefill_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Plain fp32 causal attention per sequence over K/V gathered through the block table.

    Rows past `query_start_loc[-1]` are left at zero.
    """
    num_tokens, num_heads, head_size = query.shape
    group = num_heads // key_cache.shape[2]
    scale = 1.0 / math.sqrt(head_size) if scale is None else scale
    out = torch.zeros(query.shape, dtype=torch.float32, device=query.device)
    for s in range(block_table.shape[0]):
        q0, q1, n = int(query_start_loc[s]), int(query_start_loc[s + 1]), int(seq_lens[s])
        if q1 == q0:
            continue
        k = gather_kv(key_cache, block_table[s], n).float().repeat_interleave(group, 1)
        v = gather_kv(value_cache, block_table[s], n).float().repeat_interleave(group, 1)
        q_pos = torch.arange(n - (q1 - q0), n, device=query.device)[:, None]
        k_pos = torch.arange(n, device=query.device)[None, :]
        visible = k_pos <= q_pos
        if sliding_window:
            visible &= q_pos - k_pos < sliding_window
        logits = torch.einsum("qhd,khd->hqk", query[q0:q1].float(), k) * scale
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
        out[q0:q1] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def reshape_and_cache_reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Plain torch version of `reshape_and_cache`: index-put through the flattened caches."""
    block_size = key_cache.shape[1]
    slots = slot_mapping.to(torch.int64)
    keep = slots >= 0
    slots = slots[keep]
    blk, off = slots // block_size, slots % block_size
    key_cache[blk, off] = key[keep]
    value_cache[blk, off] = value[keep]
