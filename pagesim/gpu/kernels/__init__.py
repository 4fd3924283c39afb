"""Triton kernels over the paged KV cache (need torch and triton; import lazily).

- `reshape_and_cache`: write a step's new K/V at the slot mapping.
- `paged_attention_decode`: one query token per sequence, split-K over context partitions.
- `paged_attention_prefill`: variable-length causal queries over cached prefix + new tokens.

Each module holds the kernel and its wrapper (the torch references live beside the tests);
`configs` picks tile shapes and the decode split from the problem's shape.
"""

from pagesim.gpu.kernels.configs import (
    DecodePartition,
    KernelConfig,
    decode_config,
    decode_partition,
    prefill_config,
)
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace, paged_attention_decode
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill
from pagesim.gpu.kernels.reshape_and_cache import reshape_and_cache

__all__ = [
    "DecodePartition",
    "DecodeWorkspace",
    "KernelConfig",
    "decode_config",
    "decode_partition",
    "paged_attention_decode",
    "paged_attention_prefill",
    "prefill_config",
    "reshape_and_cache",
]
