"""Pricing of the linear layers of mixture-of-experts and MLA models, for the analytical model.

A dense step reads every weight once and multiplies every token by every weight. An MoE step
(Mixtral, Qwen3-MoE, DeepSeekMoE, GPT-OSS) differs in two ways:

- **Weights read**: only the experts some token of the step is routed to. With `T` tokens,
  each routed to `k` of `E` experts, the expected number of distinct experts one layer
  touches is `E * (1 - (1 - k / E) ** T)` (uniform routing: a balanced router's long-run
  load), so a decode step of a few sequences reads a fraction of the experts and a large
  prefill reads them all.
- **GEMM work**: each token multiplies `k` experts' weights (plus the shared experts and the
  dense part). The fused-MoE kernel pads every active expert's rows up to its tile
  (`BLOCK_SIZE_M`, vLLM's `moe_align_block_size`), so small per-expert batches run at a
  fraction of the tensor cores: counted as `MOE_PAD_ROWS` extra rows per active expert per
  layer, half a 16-row tile in expectation.

MLA (DeepSeek) changes the attention projections, not their pricing: the dense part's weight
count is taken from the spec's parameter total, so both follow the config's real shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.specs import ModelSpec

MOE_PAD_ROWS = 7.5  # expected padding rows per active expert: (16 - 1) / 2


@dataclass(frozen=True)
class MoELinear:
    """Per-GPU weights of an MoE model's linear layers (lm_head apart), in parameters."""

    dense_params: float  # attention, dense-MLP layers, shared experts, routers: all layers
    expert_params: float  # one routed expert of one layer
    num_moe_layers: int
    num_experts: int
    top_k: int

    @classmethod
    def of(cls, model: ModelSpec, tensor_parallel_size: int) -> MoELinear:
        """Split the spec's parameters; the embeddings and an untied LM head (every shipped
        MoE config unties them) are not multiplied by the layers."""
        tp = tensor_parallel_size
        moe_layers = model.num_layers - model.num_dense_layers
        embeddings = 2 * model.vocab_size * model.hidden_size
        dense = model.num_params - model.num_expert_params - embeddings
        per_expert = model.num_expert_params / (moe_layers * model.num_experts)
        return cls(
            dense / tp, per_expert / tp, moe_layers, model.num_experts, model.num_experts_per_tok
        )

    def active_experts(self, num_tokens: int) -> float:
        """Expected distinct experts one MoE layer runs for `num_tokens` tokens."""
        e, k = self.num_experts, self.top_k
        return e * (1.0 - (1.0 - k / e) ** num_tokens)

    def weight_bytes_read(
        self, num_tokens: int, dtype_bytes: float, expert_bytes: float | None
    ) -> float:
        """Bytes a step of `num_tokens` tokens reads (all layers); `expert_bytes` per routed
        expert weight when they are stored apart (MXFP4), else `dtype_bytes`."""
        active = self.active_experts(num_tokens)
        per_expert = dtype_bytes if expert_bytes is None else expert_bytes
        return (
            self.dense_params * dtype_bytes
            + self.num_moe_layers * active * self.expert_params * per_expert
        )

    def gemm_params_rows(self, num_tokens: int) -> float:
        """Sum over the linear layers of rows times weights (FLOPs / 2) for the step."""
        rows = num_tokens * self.top_k + self.active_experts(num_tokens) * MOE_PAD_ROWS
        return self.dense_params * num_tokens + self.num_moe_layers * rows * self.expert_params
