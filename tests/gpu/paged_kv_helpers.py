"""Shared helpers of the kernel tests: tolerances, error measure, a random paged KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagesim.kvcache.block_table import build_block_table

#: Bound on ||out - ref|| / ||ref|| against the fp32 reference, per input dtype. fp32 runs
#: IEEE dots (~1e-6 seen); fp16 and bf16 round P to the input type before the P.V product.
REL_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.2e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp32 (NaN anywhere in out makes it NaN, which fails)."""
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def assert_close_rel(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(out).any(), "output has NaN (unwritten or bad softmax)"
    err = rel_err(out, ref)
    tol = REL_TOL[str(dtype).removeprefix("torch.")]
    assert err < tol, f"relative error {err:.3g} >= {tol:g} for {dtype}"


class PagedKV:
    """A paged KV cache filled with random data and random (permuted) block-table rows."""

    def __init__(
        self,
        gen: torch.Generator,
        seq_lens: Sequence[int],
        block_size: int,
        num_kv_heads: int,
        head_size: int,
        dtype: torch.dtype,
        device: str,
        spare_blocks: int = 3,
        table_width: int | None = None,
    ):
        needed = [-(-n // block_size) for n in seq_lens]
        num_blocks = 1 + sum(needed) + spare_blocks  # block 0 is the null block
        ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        self.block_ids: list[list[int]] = []
        for k in needed:
            self.block_ids.append(ids[:k])
            ids = ids[k:]
        shape = (num_blocks, block_size, num_kv_heads, head_size)
        self.key_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
        self.value_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
        table = build_block_table(self.block_ids, table_width)
        self.block_table = torch.tensor(table, dtype=torch.int32).reshape(len(seq_lens), -1)
        self.block_table = self.block_table.to(device)
        self.seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=device)


def randn(gen: torch.Generator, shape, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype).to(device)
