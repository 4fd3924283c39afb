"""Write a step's new K and V into the paged KV cache at `slot_mapping`.

    key[t]  ->  key_cache[slot // block_size, slot % block_size]      for t with slot >= 0
    slot = slot_mapping[t] = block_id * block_size + offset   (pagesim.kvcache.block_table)

One program per token copies all KV heads of that token (a `[num_kv_heads, head_size]` tile of
K and one of V). Padded tokens carry a negative slot (`PAD_SLOT_ID`) and are skipped, so a
CUDA-graph batch padded to a captured size writes nothing for its padding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagesim.gpu.kernels.checks import (
    check_index_tensors,
    check_kv_cache,
    check_last_dim_contiguous,
    check_same_device,
    check_same_dtype,
    check_shape,
)


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,  # [num_tokens, num_kv_heads, head_size]
    value_ptr,  # [num_tokens, num_kv_heads, head_size]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping_ptr,  # [num_tokens], int32 or int64, negative = padding
    stride_k_tok: tl.int64,  #
    stride_k_head: tl.int64,  #
    stride_v_tok: tl.int64,  #
    stride_v_head: tl.int64,  #
    stride_kc_blk: tl.int64,  #
    stride_kc_off: tl.int64,  #
    stride_kc_head: tl.int64,  #
    stride_vc_blk: tl.int64,  #
    stride_vc_off: tl.int64,  #
    stride_vc_head: tl.int64,  #
    num_kv_heads,  #
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEAD_SIZE: tl.constexpr,  # a power of two
    BLOCK_HEADS: tl.constexpr,  # next power of two >= num_kv_heads
):
    tok = tl.program_id(0).to(tl.int64)  # one program per token
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    if slot < 0:  # padding token: nothing to write
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE

    h = tl.arange(0, BLOCK_HEADS)[:, None]  # [BLOCK_HEADS, 1]
    d = tl.arange(0, HEAD_SIZE)[None, :]  # [1, HEAD_SIZE]
    mask = h < num_kv_heads  # heads padded up to a power of two

    k = tl.load(key_ptr + tok * stride_k_tok + h * stride_k_head + d, mask=mask)
    v = tl.load(value_ptr + tok * stride_v_tok + h * stride_v_head + d, mask=mask)
    kc = key_cache_ptr + blk * stride_kc_blk + off * stride_kc_off + h * stride_kc_head + d
    vc = value_cache_ptr + blk * stride_vc_blk + off * stride_vc_off + h * stride_vc_head + d
    tl.store(kc, k, mask=mask)
    tl.store(vc, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int32/int64
) -> None:
    """Write `key`/`value` rows into the caches at `slot_mapping` (negative slots skipped).

    The caches are modified in place. Slots must be below `num_blocks * block_size`; the
    wrapper does not read `slot_mapping` back to check that (it would cost a device sync).
    """
    _, block_size, num_kv_heads, head_size = check_kv_cache(key_cache, value_cache)
    check_shape("key", key, (None, num_kv_heads, head_size))
    num_tokens = key.shape[0]
    check_shape("value", value, (num_tokens, num_kv_heads, head_size))
    check_shape("slot_mapping", slot_mapping, (num_tokens,))
    for name, t in (("key", key), ("value", value)):
        check_same_dtype(name, t, "key_cache", key_cache)
        check_last_dim_contiguous(name, t)
    check_index_tensors(slot_mapping=slot_mapping)
    check_same_device(
        key=key,
        value=value,
        key_cache=key_cache,
        value_cache=value_cache,
        slot_mapping=slot_mapping,
    )
    if num_tokens == 0:
        return
    block_heads = triton.next_power_of_2(num_kv_heads)
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        *key_cache.stride()[:3],
        *value_cache.stride()[:3],
        num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_SIZE=head_size,
        BLOCK_HEADS=block_heads,
        num_warps=4 if block_heads * head_size >= 2048 else 1,
    )
