"""The paged-attention backend the GPU runner calls, one layer at a time.

A step is described once by `AttentionMetadata` (block tables, slot mapping, lengths, all on
the device, built by `PagedAttentionBackend.build_metadata` from the core's own
`pagesim.kvcache.block_table` functions) and every layer reuses it:

    metadata = backend.build_metadata(block_ids, num_computed_tokens, num_new_tokens, device)
    for layer in layers:
        q, k, v = ...                                      # [num_tokens, heads, head_size]
        out = backend.forward(q, k, v, key_caches[layer], value_caches[layer], metadata)

`forward` writes the step's new K/V into the cache at the slot mapping, then attends: a step
where every sequence has exactly one new token goes through the split-K decode kernel, any
other step (prefill, chunked prefill with a cached prefix, prefill chunks mixed with decodes)
through the variable-length prefill kernel. Nothing in `forward` syncs with the host, so a
runner may capture it in a CUDA graph once the metadata (and its workspace) exist.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.arch import device_arch
from pagesim.gpu.kernels.checks import (
    BLOCK_SIZES,
    HEAD_SIZES,
    check_choice,
    check_num_queries_per_kv,
    check_shape,
    check_sliding_window,
)
from pagesim.gpu.kernels.configs import (
    MIN_PARTITION_TOKENS,
    DecodePartition,
    KernelConfig,
    decode_config,
    decode_partition,
)
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace, paged_attention_decode
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill
from pagesim.gpu.kernels.reshape_and_cache import reshape_and_cache
from pagesim.kvcache.block_table import build_block_table, build_query_start_loc, build_slot_mapping
from pagesim.scheduler.output import is_decode

#: SM count assumed when the metadata is built for a CPU device (an H200 has 132).
DEFAULT_NUM_SMS = 132


def device_num_sms(device: torch.device) -> int:
    """The SM count that steers the decode split: the device's, `DEFAULT_NUM_SMS` on a CPU."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@dataclass(slots=True)
class AttentionMetadata:
    """One step's attention inputs on the device; built once per step, read by every layer."""

    num_seqs: int
    num_actual_tokens: int  # sum of the sequences' new tokens (rows past it are padding)
    max_query_len: int  # longest new-token run of the step (1 in a decode-only step)
    max_seq_len: int  # longest context after the step, tokens
    slot_mapping: torch.Tensor  # [num_tokens] int64, PAD_SLOT_ID (< 0) for padding rows
    block_table: torch.Tensor  # [num_seqs, max_num_blocks_per_seq] int32
    seq_lens: torch.Tensor  # [num_seqs] int32, computed + new tokens
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, prefix sums of new tokens
    # Decode-only steps: how contexts are split, and the fp32 partials buffer (None if unsplit).
    decode_partition: DecodePartition | None = None
    decode_workspace: DecodeWorkspace | None = None

    @property
    def is_decode_only(self) -> bool:
        return self.decode_partition is not None


class PagedAttentionBackend:
    """Attention of one model's layers over a paged KV cache (vLLM's flash layout).

    KV cache per layer: key and value tensors `[num_blocks, block_size, num_kv_heads,
    head_size]`, block 0 reserved as the null block that padded block-table entries name.
    `sliding_window` (tokens, the query itself included) limits each query to its last
    `sliding_window` positions, as Mistral does; `None` attends to the whole context.
    `min_partition_tokens` is the shortest context slice a decode program is given when the
    split rule (`configs.decode_partition`) divides contexts among more programs.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        block_size: int,
        scale: float | None = None,
        sliding_window: int | None = None,
        min_partition_tokens: int = MIN_PARTITION_TOKENS,
    ) -> None:
        self.num_queries_per_kv = check_num_queries_per_kv(num_heads, num_kv_heads)
        check_choice("head_size", head_size, HEAD_SIZES)
        check_choice("block_size", block_size, BLOCK_SIZES)
        check_sliding_window(sliding_window)
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.block_size = block_size
        self.scale = 1.0 / math.sqrt(head_size) if scale is None else float(scale)
        self.sliding_window = sliding_window
        if min_partition_tokens < 1:
            raise KernelInputError(f"min_partition_tokens={min_partition_tokens}, expected >= 1")
        self.min_partition_tokens = min_partition_tokens

    def decode_config(self, device: torch.device) -> KernelConfig:
        """The decode kernel's launch configuration for these heads on `device`."""
        on_gpu = device.type == "cuda"
        return decode_config(self.head_size, self.num_queries_per_kv, on_gpu, device_arch(device))

    def kv_cache_shape(self, num_blocks: int) -> tuple[int, int, int, int]:
        """Shape of one layer's key (or value) cache: `[num_blocks, block_size, kv_heads, D]`."""
        return (num_blocks, self.block_size, self.num_kv_heads, self.head_size)

    def build_metadata(
        self,
        block_ids_per_seq: Sequence[Sequence[int]],
        num_computed_tokens: Sequence[int],
        num_new_tokens: Sequence[int],
        device: torch.device | str,
        max_num_blocks_per_seq: int | None = None,
        pad_to: int | None = None,
        num_sms: int | None = None,
    ) -> AttentionMetadata:
        """Tensors for one step, from the block-table rows the KV cache manager handed out.

        Sequence i computes tokens `num_computed_tokens[i] .. + num_new_tokens[i] - 1`; its
        queries sit at rows `query_start_loc[i] ..` of the step's `[num_tokens, ...]` tensors.
        `pad_to` pads the slot mapping (CUDA-graph batch sizes); `num_sms` defaults to the
        device's SM count (`DEFAULT_NUM_SMS` on a CPU) and steers the decode split.
        """
        if not (len(block_ids_per_seq) == len(num_computed_tokens) == len(num_new_tokens)):
            raise KernelInputError(
                f"block_ids_per_seq, num_computed_tokens, num_new_tokens lengths differ: "
                f"{len(block_ids_per_seq)}, {len(num_computed_tokens)}, {len(num_new_tokens)}"
            )
        device = torch.device(device)
        seq_lens = [c + n for c, n in zip(num_computed_tokens, num_new_tokens, strict=True)]
        slots = build_slot_mapping(
            block_ids_per_seq, num_computed_tokens, num_new_tokens, self.block_size, pad_to=pad_to
        )
        table = build_block_table(block_ids_per_seq, max_num_blocks_per_seq)
        qsl = build_query_start_loc(num_new_tokens)
        num_seqs = len(seq_lens)
        max_seq_len = max(seq_lens, default=0)
        md = AttentionMetadata(
            num_seqs=num_seqs,
            num_actual_tokens=qsl[-1],
            max_query_len=max(num_new_tokens, default=0),
            max_seq_len=max_seq_len,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
            block_table=torch.tensor(table, dtype=torch.int32).reshape(num_seqs, -1).to(device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32).to(device),
        )
        if num_seqs and all(map(is_decode, num_new_tokens, num_computed_tokens)):
            md.decode_partition = decode_partition(
                num_seqs,
                self.num_kv_heads,
                max_seq_len,
                self.decode_config(device),
                device_num_sms(device) if num_sms is None else num_sms,
                self.sliding_window,
                self.min_partition_tokens,
            )
            if md.decode_partition.num_partitions > 1:
                md.decode_workspace = DecodeWorkspace.allocate(
                    num_seqs,
                    self.num_heads,
                    self.head_size,
                    md.decode_partition.num_partitions,
                    device,
                )
        return md

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_size]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
        key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
        value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
        metadata: AttentionMetadata,
        out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_size]
    ) -> torch.Tensor:
        """One layer's attention for the step: cache the new K/V, then attend.

        Returns `out`; rows past `metadata.num_actual_tokens` (padding) are not written.
        """
        md = metadata
        num_tokens = md.slot_mapping.shape[0]
        check_shape("query", query, (num_tokens, self.num_heads, self.head_size))
        check_shape(
            "key_cache", key_cache, (None, self.block_size, self.num_kv_heads, self.head_size)
        )
        if out is None:
            out = torch.empty_like(query)
        reshape_and_cache(key, value, key_cache, value_cache, md.slot_mapping)
        if md.decode_partition is not None:
            n = md.num_seqs
            paged_attention_decode(
                query[:n],
                key_cache,
                value_cache,
                md.block_table,
                md.seq_lens,
                md.decode_partition,
                self.scale,
                self.sliding_window,
                out=out[:n],
                workspace=md.decode_workspace,
            )
        else:
            paged_attention_prefill(
                query,
                key_cache,
                value_cache,
                md.block_table,
                md.seq_lens,
                md.query_start_loc,
                self.scale,
                self.sliding_window,
                out=out,
            )
        return out
