"""Argument checks shared by the kernel wrappers.

Each check raises `KernelInputError` with one line naming the argument and what was wrong, so a
bad call fails in Python before a kernel reads out of bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagesim.errors import KernelInputError

#: Dtypes the attention kernels read and write (accumulation is always fp32).
ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Dtypes accepted for index tensors (block tables, slot mappings, lengths).
INDEX_DTYPES = (torch.int32, torch.int64)
#: Head sizes the kernels are built for (powers of two, so a head is one `tl.arange`); 32 is
#: the `tiny-llama` spec's, which the GPU runner's CPU tests run end to end.
HEAD_SIZES = (32, 64, 128, 256)
#: Block sizes (tokens per KV page) the kernels are built for.
BLOCK_SIZES = (8, 16, 32, 64, 128)


def check_dtype(name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """`t.dtype` must be one of `allowed`."""
    if t.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise KernelInputError(f"{name}.dtype={t.dtype} not in ({names})")


def check_same_dtype(name: str, t: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """`t` must have the dtype of `ref` (kernels do not convert between K/V and cache dtypes)."""
    if t.dtype != ref.dtype:
        raise KernelInputError(f"{name}.dtype={t.dtype} differs from {ref_name}.dtype={ref.dtype}")


def check_shape(name: str, t: torch.Tensor, shape: Sequence[int | None]) -> None:
    """`t.shape` must match `shape`, where `None` matches any size."""
    ok = t.dim() == len(shape) and all(
        s is None or s == n for s, n in zip(shape, t.shape, strict=False)
    )
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise KernelInputError(f"{name}.shape={list(t.shape)}, expected {want}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """The innermost dimension must have stride 1 (rows are read as whole vectors)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise KernelInputError(f"{name}.stride(-1)={t.stride(-1)}, expected 1")


def check_contiguous(name: str, t: torch.Tensor) -> None:
    """The whole tensor must be contiguous (small index tensors the kernels walk flat)."""
    if not t.is_contiguous():
        raise KernelInputError(f"{name} is not contiguous (strides {list(t.stride())})")


def check_same_device(**tensors: torch.Tensor) -> None:
    """All tensors must live on one device (the first one's)."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise KernelInputError(
                f"{name}.device={t.device} differs from {first_name}.device={first.device}"
            )


def check_index_tensors(**tensors: torch.Tensor) -> None:
    """Block tables, lengths and offsets: int32/int64 and contiguous (the kernels walk them
    flat)."""
    for name, t in tensors.items():
        check_dtype(name, t, INDEX_DTYPES)
        check_contiguous(name, t)


def check_choice(name: str, value: int, allowed: Sequence[int]) -> None:
    """`value` must be one of `allowed` (head sizes, block sizes)."""
    if value not in allowed:
        raise KernelInputError(f"{name}={value} not in {tuple(allowed)}")


def check_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Key and value caches: `[num_blocks, block_size, num_kv_heads, head_size]`, same dtype.

    Returns `(num_blocks, block_size, num_kv_heads, head_size)`.
    """
    check_shape("key_cache", key_cache, (None, None, None, None))
    check_shape("value_cache", value_cache, tuple(key_cache.shape))
    check_dtype("key_cache", key_cache, ATTENTION_DTYPES)
    if value_cache.dtype != key_cache.dtype:
        raise KernelInputError(
            f"value_cache.dtype={value_cache.dtype} differs from key_cache.dtype={key_cache.dtype}"
        )
    check_last_dim_contiguous("key_cache", key_cache)
    check_last_dim_contiguous("value_cache", value_cache)
    num_blocks, block_size, num_kv_heads, head_size = key_cache.shape
    check_choice("block_size", block_size, BLOCK_SIZES)
    check_choice("head_size", head_size, HEAD_SIZES)
    return num_blocks, block_size, num_kv_heads, head_size


def check_num_queries_per_kv(num_heads: int, num_kv_heads: int) -> int:
    """Query heads must split evenly over KV heads (MHA, GQA, MQA); returns heads per group."""
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise KernelInputError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}"
        )
    return num_heads // num_kv_heads


def check_sliding_window(sliding_window: int | None) -> int:
    """Window in tokens (each query sees itself and the `w - 1` keys before it), or `None`.

    Returns the kernels' constexpr form: 0 for no window.
    """
    if sliding_window is None:
        return 0
    if sliding_window < 1:
        raise KernelInputError(f"sliding_window={sliding_window}, expected >= 1 or None")
    return int(sliding_window)


def check_attention_inputs(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[int, int, int, int]:
    """Queries `[rows, num_heads, head_size]` over the caches' heads and dtype.

    Returns `(block_size, num_kv_heads, head_size, num_queries_per_kv)`.
    """
    _, block_size, num_kv_heads, head_size = check_kv_cache(key_cache, value_cache)
    check_shape("query", query, (None, None, head_size))
    group = check_num_queries_per_kv(query.shape[1], num_kv_heads)
    check_same_dtype("query", query, "key_cache", key_cache)
    check_last_dim_contiguous("query", query)
    return block_size, num_kv_heads, head_size, group


def attention_output(out: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor:
    """`out` checked against the query it is written for, or a new one like it."""
    if out is None:
        return torch.empty_like(query)
    check_shape("out", out, tuple(query.shape))
    check_dtype("out", out, ATTENTION_DTYPES)
    check_last_dim_contiguous("out", out)
    return out
