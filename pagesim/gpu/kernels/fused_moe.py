"""Mixture-of-experts MLP as one grouped GEMM per stage over token-expert pairs sorted by expert.

A MoE layer sends each of its T tokens to k of E experts. A Python loop over experts costs E
launches and a host sync per layer (to learn which tokens each expert got); running every
expert on every token costs E / k times the work. As vLLM's fused MoE does, the T * k
(token, expert) pairs are grouped by expert instead, each expert's run padded to a whole number
of row tiles, so that every tile of the sorted list belongs to one expert and one launch
multiplies each tile by its own expert's weights:

    pair p = t * k + j                 token t's j-th choice, expert topk_ids[t, j]
    sorted_pair_ids  [max_tiles * BLOCK_M]  pair ids grouped by expert; each group padded to a
                                            multiple of BLOCK_M with P = T * k (loads nothing)
    tile_expert      [max_tiles]            the expert of each BLOCK_M-row tile
    num_padded       [1]                    rows in use; tiles past them exit at once

        sorted rows   | e0 e0 e0 -- | e2 e2 e2 e2 | e2 -- -- -- | e5 -- -- -- | (unused) |
        tile_expert   |      0      |      2      |      2      |      5      |          |

    stage 1   inter[p] = silu(x[t] @ W_gate[e]^T) * (x[t] @ W_up[e]^T)        [P, I]
    stage 2   y[p]     = w[p] * (inter[p] @ W_down[e]^T)                      [P, H]
    out[t]    = sum_j y[t * k + j]                                            [T, H]

Both stages are one kernel, one program per (row tile, column tile): with GATED (stage 1) it
keeps two accumulators, the gate and the up columns of the same tile, and applies SiLU-and-mul
before storing, so the [P, 2I] gate/up output never reaches memory. The alignment is built on
the device from fixed-shape torch ops (scatter-add counts, cumulative sums, a stable sort,
a sorted search), sized for the worst case max_padded = P + min(E, P) * (BLOCK_M - 1): nothing
syncs with the host and every shape depends on T alone, so a decode step's MoE layers are
captured in its CUDA graph like any other op.

Weights as vLLM lays them out: w13 `[E, 2I, H]` (gate rows, then up rows), w2 `[E, H, I]`.
Order of this file: routing, alignment, kernel, wrapper, torch reference.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.checks import (
    ATTENTION_DTYPES,
    check_dtype,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
)


class MoEConfig(NamedTuple):
    """Tile shape and launch parameters of the grouped GEMM."""

    block_m: int  # pair rows per tile (each expert's run is padded to a multiple)
    block_n: int  # output columns per tile
    block_k: int  # reduction depth per iteration
    num_warps: int
    num_stages: int


def moe_config(num_tokens: int, top_k: int, num_experts: int, on_gpu: bool) -> MoEConfig:
    """The tile for a step of `num_tokens` tokens, by rule (no autotuning: the choice must be
    known before a graph is captured, and the interpreter cannot autotune).

    Few pairs per expert (decode): 16-row tiles, so that padding stays small and the step is
    the weight read it is; many (prefill): 64 x 128 tiles that reuse each weight tile over 64
    rows. The interpreter gets the fewest programs and loop iterations (its cost is per
    program and per op, nearly whatever the tile's size)."""
    if not on_gpu:
        return MoEConfig(16, 128, 128, 4, 1)
    if num_tokens * top_k <= 16 * num_experts:
        return MoEConfig(16, 64, 128, 4, 3)
    return MoEConfig(64, 128, 64, 8, 3)


# ---- routing -------------------------------------------------------------------------------
def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights fp32 `[T, k]`, expert ids int32 `[T, k]`): softmax over the experts, the top k,
    renormalised to sum to one (Qwen3-MoE with norm_topk_prob; Mixtral's softmax over its top-k
    logits is the same numbers). Ties go as `torch.topk` breaks them."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


# ---- alignment -----------------------------------------------------------------------------
class MoEAlignment(NamedTuple):
    """Pairs grouped by expert, padded per expert to whole tiles (see the module docstring)."""

    sorted_pair_ids: torch.Tensor  # [max_tiles * block_m] int32, num_pairs for padding
    tile_expert: torch.Tensor  # [max_tiles] int32
    num_padded: torch.Tensor  # [1] int32, rows of sorted_pair_ids in use


def max_num_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Row tiles of the worst case: every used expert's run wastes block_m - 1 rows."""
    return triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Group the `[T, k]` pairs by expert (stable: pairs of one expert keep token order), each
    expert's run starting at a multiple of `block_m`. Fixed shapes, no host sync."""
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    num_pairs = flat.numel()
    tiles = max_num_tiles(num_pairs, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    first = counts.cumsum(0) - counts  # each expert's first index in the unpadded order
    order = torch.sort(flat, stable=True).indices
    experts = flat[order]
    rank = torch.arange(num_pairs, device=device) - first[experts]
    dest = padded_end[experts] - padded[experts] + rank
    sorted_ids = torch.full((tiles * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    tile_start = torch.arange(tiles, device=device, dtype=torch.int64) * block_m
    tile_expert = torch.searchsorted(padded_end, tile_start, right=True)
    tile_expert = tile_expert.clamp_(max=num_experts - 1).to(torch.int32)
    return MoEAlignment(sorted_ids, tile_expert, padded_end[-1:].to(torch.int32))


# ---- kernel --------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["num_pairs"])
def _grouped_gemm_kernel(
    out_ptr,  # [num_pairs, N], row = pair id
    a_ptr,  # [rows, K]: x [T, H] (stage 1, row = pair // A_ROW_DIV) or inter [P, I] (stage 2)
    w_ptr,  # [E, N (x2 when GATED), K]
    pair_weight_ptr,  # [num_pairs] fp32, read when MUL_WEIGHT
    sorted_pair_ids_ptr,  # [max_tiles * BLOCK_M] int32
    tile_expert_ptr,  # [max_tiles] int32
    num_padded_ptr,  # [1] int32
    num_pairs,  #
    N,  # output columns (per half when GATED)
    K,  #
    stride_am: tl.int64,
    stride_we: tl.int64,
    stride_wn: tl.int64,
    stride_om: tl.int64,
    A_ROW_DIV: tl.constexpr,  # top_k for stage 1 (pair -> token), 1 for stage 2
    GATED: tl.constexpr,  # stage 1: gate and up halves, silu(gate) * up
    MUL_WEIGHT: tl.constexpr,  # stage 2: scale each row by its routing weight
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for fp32 inputs, else "tf32" (ignored by 16-bit)
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):  # past the last expert's run
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_pair_ids_ptr + rows)
    valid = pairs < num_pairs  # padding rows load zeros and store nothing
    expert = tl.load(tile_expert_ptr + pid_m).to(tl.int64)
    a_rows = (pairs // A_ROW_DIV).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + ks[None, :]
    w_ptrs = w_ptr + expert * stride_we + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
    up_ptrs = w_ptrs + N * stride_wn  # GATED: the up rows follow the gate rows
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = ks < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & col_mask[None, :]
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = tl.dot(a, w, acc=acc, input_precision=DOT_PRECISION)
        if GATED:
            u = tl.load(up_ptrs, mask=w_mask, other=0.0)
            acc_up = tl.dot(a, u, acc=acc_up, input_precision=DOT_PRECISION)
            up_ptrs += BLOCK_K
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(pair_weight_ptr + pairs, mask=valid, other=0.0)[:, None]
    out_ptrs = out_ptr + pairs[:, None].to(tl.int64) * stride_om + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & col_mask[None, :])


# ---- wrapper -------------------------------------------------------------------------------
def _check(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    check_dtype("x", x, ATTENTION_DTYPES)
    check_shape("x", x, (None, None))
    t, h = x.shape
    check_shape("w13", w13, (None, None, h))
    e, two_i = w13.shape[0], w13.shape[1]
    if two_i % 2:
        raise KernelInputError(f"w13.shape[1]={two_i}: gate and up halves must be equal")
    check_shape("w2", w2, (e, h, two_i // 2))
    check_shape("topk_ids", topk_ids, (t, None))
    check_shape("topk_weights", topk_weights, (t, topk_ids.shape[1]))
    check_dtype("topk_ids", topk_ids, (torch.int32, torch.int64))
    for name, w in (("w13", w13), ("w2", w2)):
        check_same_dtype(name, w, "x", x)
        if not w.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous (strides {list(w.stride())})")
    check_last_dim_contiguous("x", x)
    check_same_device(x=x, w13=w13, w2=w2, topk_ids=topk_ids)


def fused_moe(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] (any float dtype; used in fp32)
    topk_ids: torch.Tensor,  # [T, k] int
    config: MoEConfig | None = None,
) -> torch.Tensor:
    """`[T, H]`: sum over each token's k experts of weight * down(silu(gate) * up)."""
    _check(x, w13, w2, topk_weights, topk_ids)
    t, h = x.shape
    e, inter = w13.shape[0], w2.shape[2]
    k = topk_ids.shape[1]
    num_pairs = t * k
    cfg = config or moe_config(t, k, e, x.is_cuda)
    align = moe_align(topk_ids, e, cfg.block_m)
    tiles = align.tile_expert.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    inter_out = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)
    y = torch.empty((num_pairs, h), dtype=x.dtype, device=x.device)
    weights = topk_weights.reshape(-1).float()
    for out, a, w, n, kdim, row_div, gated in (
        (inter_out, x, w13, inter, h, k, True),
        (y, inter_out, w2, h, inter, 1, False),
    ):
        grid = (tiles, triton.cdiv(n, cfg.block_n))
        _grouped_gemm_kernel[grid](
            out,
            a,
            w,
            weights,
            align.sorted_pair_ids,
            align.tile_expert,
            align.num_padded,
            num_pairs,
            n,
            kdim,
            a.stride(0),
            w.stride(0),
            w.stride(1),
            out.stride(0),
            A_ROW_DIV=row_div,
            GATED=gated,
            MUL_WEIGHT=not gated,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            DOT_PRECISION=precision,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return y.view(t, k, h).sum(dim=1)


# ---- reference -----------------------------------------------------------------------------
def fused_moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Dense fp32: every expert on every token, weighted by a `[T, E]` matrix that is zero
    outside each token's choices (returns fp32 `[T, H]`)."""
    t, e = x.shape[0], w13.shape[0]
    dense = torch.zeros((t, e), dtype=torch.float32, device=x.device)
    dense.scatter_add_(1, topk_ids.long(), topk_weights.float())
    xf = x.float()
    out = torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device)
    for i in range(e):
        gate, up = F.linear(xf, w13[i].float()).chunk(2, dim=-1)
        out += dense[:, i : i + 1] * F.linear(F.silu(gate) * up, w2[i].float())
    return out
