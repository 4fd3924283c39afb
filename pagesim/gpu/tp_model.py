"""One rank's shard of the random-weight decoder (Llama family) under tensor parallelism.

`TensorParallelDecoder` is `RandomWeightDecoder` with `tp_rank`/`tp_size` taken from a
`TPGroup`: every weight is drawn exactly as the unsharded model draws it (same seed, same order,
one layer at a time on the device) and cut to this rank's shard at once, so the shards of all
ranks put together *are* the unsharded model's weights. Hence the test that matters: the
sharded model's logits equal the unsharded model's, within fp32 summation-order tolerance.

Per rank (`tp` ranks, H query heads, KV heads, I intermediate, V vocabulary):

    embed     [ceil(V / tp), hidden]       vocab-parallel, all-reduced (one extra all-reduce)
    qkv       [(H + 2 KV') D / tp .., hidden]  column-parallel, KV' = this rank's KV heads
    o         [hidden, H D / tp]           row-parallel: all-reduce #1 of the layer
    gate_up   [2 I / tp, hidden]           column-parallel (gate and up sharded separately)
    down      [hidden, I / tp]             row-parallel: all-reduce #2 of the layer
    norms     [hidden]                     replicated
    lm_head   [ceil(V / tp), hidden]       vocab-parallel; logits all-gathered to [S, V] on
                                           every rank, which then all sample the same tokens

KV cache per rank: `[num_blocks, block_size, KV', D]` per layer (the attention backend is built
for this rank's heads), which is what `kvcache.sizing` counts per GPU. OPT is not sharded here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagesim.errors import ConfigError
from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
from pagesim.gpu.parallel import (
    TPGroup,
    kv_head_range,
    row_parallel_linear,
    shard_cols,
    shard_qkv,
    shard_rows,
    shard_vocab,
    split_range,
    vocab_parallel_embedding,
    vocab_range,
)
from pagesim.specs import ModelSpec


def check_tensor_parallel(spec: ModelSpec, tp: int) -> None:
    """One-line `ConfigError` unless `spec` can be split `tp` ways (Llama family only)."""
    if spec.arch != "llama":
        raise ConfigError(
            f"model={spec.name!r}: tensor parallelism supports the Llama family "
            f"only (arch {spec.arch!r})"
        )
    if spec.is_moe:
        raise ConfigError(
            f"model={spec.name!r}: tensor parallelism of mixture-of-experts layers is not "
            "modelled on the GPU"
        )
    split_range(spec.num_attention_heads, 0, tp, "num_attention_heads")
    split_range(spec.intermediate_size, 0, tp, "intermediate_size")
    kv_head_range(spec.num_kv_heads, 0, tp)


def shard_layer(
    layer: dict[str, torch.Tensor], spec: ModelSpec, rank: int, tp: int
) -> dict[str, torch.Tensor]:
    """Rank `rank`'s shard of one unsharded Llama layer (`model.layer_shapes` names)."""
    inter = spec.intermediate_size
    return {
        "qkv": shard_qkv(
            layer["qkv"], spec.num_attention_heads, spec.num_kv_heads, spec.head_size, rank, tp
        ),
        "o": shard_cols(layer["o"], rank, tp, "num_attention_heads * head_size"),
        "norm1": layer["norm1"],
        "norm2": layer["norm2"],
        "gate_up": shard_rows(layer["gate_up"], rank, tp, (inter, inter), "intermediate_size"),
        "down": shard_cols(layer["down"], rank, tp, "intermediate_size"),
    }


class TensorParallelDecoder(RandomWeightDecoder):
    """Rank `group.rank`'s shard of `spec`'s random-weight decoder; a drop-in model for
    `GPUModelRunner` (same `forward`, `compute_logits`, `sample`, `set_block_size`)."""

    def __init__(self, config: DecoderConfig, group: TPGroup) -> None:
        spec = config.spec
        check_tensor_parallel(spec, group.world_size)
        self.group = group
        self.tp_rank, self.tp_size = group.rank, group.world_size
        super().__init__(config)  # layers sharded as drawn
        rank, tp = self.tp_rank, self.tp_size
        self.vocab_start = vocab_range(spec.vocab_size, rank, tp)[0]
        self.embed = shard_vocab(self.embed, rank, tp)
        self.lm_head = shard_vocab(self.lm_head, rank, tp)

    def _attention_heads(self) -> tuple[int, int]:
        """This rank's query heads and KV heads (the attention backends are built for them)."""
        k0, k1 = kv_head_range(self.spec.num_kv_heads, self.tp_rank, self.tp_size)
        return self.spec.num_attention_heads // self.tp_size, k1 - k0

    def _make_layer(self, gen: torch.Generator, index: int) -> dict[str, torch.Tensor]:
        """Draw the whole layer as the unsharded model does, keep this rank's shard."""
        return shard_layer(super()._make_layer(gen, index), self.spec, self.tp_rank, self.tp_size)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings from this rank's vocab slice, summed over the group."""
        return vocab_parallel_embedding(input_ids, self.embed, self.vocab_start, self.group)

    def _row_linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """This rank's share of a row-parallel projection, all-reduced: `forward` is then
        `RandomWeightDecoder.forward` with the two all-reduces per layer, returning the full
        (replicated) `[S, hidden]` rows after the final norm."""
        return row_parallel_linear(x, weight, self.group)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[S, vocab]` fp32 logits on every rank: local vocab slice, all-gathered, padding cut."""
        local = F.linear(hidden, self.lm_head)  # [S, ceil(V / tp)]
        return self.group.all_gather_last(local)[:, : self.spec.vocab_size].float()
