"""Frozen model and GPU specs, looked up by name.

Every value carries its source in a comment. Lookups that miss raise one line listing the known
names (`ModelSpec.from_name("llama-9b")`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pagesim.errors import unknown_name

GiB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer, as far as serving cost and KV size go."""

    name: str
    arch: Literal["llama", "opt"]  # llama: RMSNorm + RoPE + SwiGLU; opt: LayerNorm + GELU MLP
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int  # < num_attention_heads means GQA/MQA
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int  # the model's max_model_len
    num_params: int  # total parameters, embeddings included
    dtype_bytes: int = 2  # fp16/bf16 weights
    sliding_window: int | None = None  # tokens, for sliding-window attention models
    hf_id: str = ""

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        key = name.lower()
        if key not in MODELS:
            raise unknown_name("model", name, list(MODELS))
        return MODELS[key]


@dataclass(frozen=True)
class GPUSpec:
    """A GPU as the cost model and KV sizing see it. Rates are datasheet peaks (dense)."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    fp16_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    host_link_bytes_per_s: float  # one direction, GPU <-> CPU (PCIe or C2C)
    nvlink_bytes_per_s: float = 0.0  # one direction per GPU, 0 where there is none

    @classmethod
    def from_name(cls, name: str) -> GPUSpec:
        key = name.lower()
        if key not in GPUS:
            raise unknown_name("GPU", name, list(GPUS))
        return GPUS[key]


# Filled in below; module-level constants, never mutated at run time.
MODELS: dict[str, ModelSpec] = {}
GPUS: dict[str, GPUSpec] = {}
