"""Frozen model and GPU specs, looked up by name.

Every value carries its source in a comment. Lookups that miss raise one line listing the known
names (`ModelSpec.from_name("llama-9b")`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
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
    # Per-layer attention kinds, "full" or "sliding" (HF `layer_types`). Empty: every layer
    # is sliding when `sliding_window` is set, else full.
    layer_types: tuple[str, ...] = ()
    # ---- mixture of experts (num_experts == 0: a dense MLP in every layer) ----
    num_experts: int = 0  # routed experts per MoE layer
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # one expert's intermediate size
    num_shared_experts: int = 0  # always-active experts of moe_intermediate_size (DeepSeek)
    num_dense_layers: int = 0  # leading layers that keep the dense MLP (first_k_dense_replace)
    num_expert_params: int = 0  # of num_params, the routed experts' weights
    expert_bytes_per_param: float | None = None  # None: dtype_bytes; 0.53125 for MXFP4
    # ---- multi-head latent attention (kv_lora_rank None: plain K/V heads) ----
    kv_lora_rank: int | None = None  # the cached latent, per token per layer
    qk_rope_head_dim: int = 0  # the cached rope part of the key, per token per layer
    v_head_dim: int = 0

    @property
    def weight_bytes(self) -> int:
        if self.expert_bytes_per_param is None:
            return self.num_params * self.dtype_bytes
        dense = (self.num_params - self.num_expert_params) * self.dtype_bytes
        return dense + math.ceil(self.num_expert_params * self.expert_bytes_per_param)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def use_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def attention_kinds(self) -> tuple[str, ...]:
        """One entry per layer: "full" or "sliding"."""
        if self.layer_types:
            return self.layer_types
        kind = "full" if self.sliding_window is None else "sliding"
        return (kind,) * self.num_layers

    @property
    def is_hybrid(self) -> bool:
        """Sliding-window and full-attention layers in one model (Gemma 2, GPT-OSS)."""
        return len(set(self.attention_kinds)) > 1

    @classmethod
    def from_name(cls, name: str) -> ModelSpec:
        """A shipped model by name or Hugging Face id, or a `config.json` (a path, or a folder
        holding one), as `vllm serve --model` takes it."""
        key = name.lower()
        if key in MODELS:
            return MODELS[key]
        from pagesim.hf_config import resolve_model  # hf_config builds on this module

        return resolve_model(name)


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


def _gib(x: float) -> int:
    return round(x * GiB)


# ---------------------------------------------------------------------------------------------
# Models. Shapes from each repository's HF `config.json` (hidden_size, num_hidden_layers,
# num_attention_heads, num_key_value_heads, intermediate_size / ffn_dim, vocab_size,
# max_position_embeddings, torch_dtype). `num_params` is the exact count those shapes give
# (embeddings and, where untied, the LM head included); tests/test_specs.py recomputes it from
# the shapes, and it matches the published totals (Llama-2-7b 6,738,415,616 ...).
# Module-level constants, never mutated at run time.
# ---------------------------------------------------------------------------------------------
# meta-llama/Meta-Llama-3-8B config.json (bfloat16)
_LLAMA_3_8B = ModelSpec(
    "llama-3-8b",
    "llama",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_size=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=8192,
    num_params=8_030_261_248,
    hf_id="meta-llama/Meta-Llama-3-8B",
)
# meta-llama/Llama-2-70b-hf config.json (float16; GQA with 8 KV heads)
_LLAMA_2_70B = ModelSpec(
    "llama-2-70b",
    "llama",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    head_size=128,
    intermediate_size=28672,
    vocab_size=32000,
    max_position_embeddings=4096,
    num_params=68_976_648_192,
    hf_id="meta-llama/Llama-2-70b-hf",
)
# meta-llama/Meta-Llama-3-70B config.json (bfloat16): Llama 2 70B's layer shapes with a
# 128,256-token vocabulary and an 8k context.
_LLAMA_3_70B = replace(
    _LLAMA_2_70B,
    name="llama-3-70b",
    vocab_size=128256,
    max_position_embeddings=8192,
    num_params=70_553_706_496,
    hf_id="meta-llama/Meta-Llama-3-70B",
)
_MODEL_LIST: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-2-7b-hf config.json (float16)
    ModelSpec(
        "llama-2-7b",
        "llama",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=32,
        head_size=128,
        intermediate_size=11008,
        vocab_size=32000,
        max_position_embeddings=4096,
        num_params=6_738_415_616,
        hf_id="meta-llama/Llama-2-7b-hf",
    ),
    # meta-llama/Llama-2-13b-hf config.json (float16)
    ModelSpec(
        "llama-2-13b",
        "llama",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=40,
        head_size=128,
        intermediate_size=13824,
        vocab_size=32000,
        max_position_embeddings=4096,
        num_params=13_015_864_320,
        hf_id="meta-llama/Llama-2-13b-hf",
    ),
    _LLAMA_2_70B,
    _LLAMA_3_8B,
    _LLAMA_3_70B,
    # meta-llama/Llama-3.1-8B config.json (bfloat16; rope_scaling "llama3", 128k context):
    # Llama 3 8B's shapes with a longer context.
    replace(
        _LLAMA_3_8B,
        name="llama-3.1-8b",
        max_position_embeddings=131072,
        hf_id="meta-llama/Llama-3.1-8B",
    ),
    # meta-llama/Llama-3.1-70B config.json (bfloat16; 128k context): Llama 3 70B's shapes.
    replace(
        _LLAMA_3_70B,
        name="llama-3.1-70b",
        max_position_embeddings=131072,
        hf_id="meta-llama/Llama-3.1-70B",
    ),
    # mistralai/Mistral-7B-v0.1 config.json (bfloat16): the layer shapes Llama 3 8B has too,
    # with a 32,000-token vocabulary, max_position_embeddings 32768 and sliding_window 4096
    # on every layer.
    replace(
        _LLAMA_3_8B,
        name="mistral-7b",
        vocab_size=32000,
        max_position_embeddings=32768,
        num_params=7_241_732_096,
        sliding_window=4096,
        hf_id="mistralai/Mistral-7B-v0.1",
    ),
    # facebook/opt-13b config.json (float16; ffn_dim 20480, learned positions with 2 offset
    # rows, tied LM head, biases everywhere)
    ModelSpec(
        "opt-13b",
        "opt",
        num_layers=40,
        hidden_size=5120,
        num_attention_heads=40,
        num_kv_heads=40,
        head_size=128,
        intermediate_size=20480,
        vocab_size=50272,
        max_position_embeddings=2048,
        num_params=12_853_473_280,
        hf_id="facebook/opt-13b",
    ),
    # facebook/opt-66b config.json (float16; ffn_dim 36864)
    ModelSpec(
        "opt-66b",
        "opt",
        num_layers=64,
        hidden_size=9216,
        num_attention_heads=72,
        num_kv_heads=72,
        head_size=128,
        intermediate_size=36864,
        vocab_size=50272,
        max_position_embeddings=2048,
        num_params=65_719_701_504,
        hf_id="facebook/opt-66b",
    ),
    # OPT-175B has no public HF config: OPT paper (Zhang et al. 2022, arXiv:2205.01068) Table 1
    # (96 layers, 96 heads, d_model 12288, ffn 4 * d_model, 2048 context) with OPT's
    # 50272-entry vocabulary.
    ModelSpec(
        "opt-175b",
        "opt",
        num_layers=96,
        hidden_size=12288,
        num_attention_heads=96,
        num_kv_heads=96,
        head_size=128,
        intermediate_size=49152,
        vocab_size=50272,
        max_position_embeddings=2048,
        num_params=174_604_468_224,
        hf_id="facebook/opt-175b",
    ),
    # Qwen/Qwen2.5-7B config.json (bfloat16; untied LM head, q/k/v biases; the Instruct
    # variant's config.json says max_position_embeddings 32768). arch "llama": Qwen2 is Llama
    # plus q/k/v biases, which the serving cost model can ignore.
    ModelSpec(
        "qwen2.5-7b",
        "llama",
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_kv_heads=4,
        head_size=128,
        intermediate_size=18944,
        vocab_size=152064,
        max_position_embeddings=131072,
        num_params=7_615_616_512,
        hf_id="Qwen/Qwen2.5-7B",
    ),
    # A tiny Llama-shaped model with random weights, for CPU tests of the GPU runner.
    ModelSpec(
        "tiny-llama",
        "llama",
        num_layers=2,
        hidden_size=128,
        num_attention_heads=4,
        num_kv_heads=2,
        head_size=32,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=2048,
        num_params=426_624,
    ),
)

# ---------------------------------------------------------------------------------------------
# GPUs. `memory_bytes` is the total that the CUDA runtime reports (torch.cuda.mem_get_info()[1],
# the "total capacity" of torch's OOM message), which is what vLLM multiplies by
# gpu_memory_utilization; it is a little below the marketing figure. Rates are NVIDIA datasheet
# peaks: dense fp16/bf16 tensor-core FLOP/s (without 2:4 sparsity), HBM/GDDR bandwidth in
# decimal bytes/s. Host link: one direction of the card's PCIe x16 link at its nominal rate
# (gen4: 64 GB/s bidirectional -> 32e9 per direction; gen5: 128 GB/s -> 64e9); measured
# pinned-memory copies reach ~80% of it. NVLink: half the datasheet's bidirectional total.
# ---------------------------------------------------------------------------------------------
_GPU_LIST: tuple[GPUSpec, ...] = (
    # A100 SXM4 40GB: NVIDIA A100 datasheet (1,555 GB/s HBM2, 312 TFLOPS fp16/bf16 dense,
    # NVLink 600 GB/s, PCIe gen4). Memory: torch reports 39.39 GiB total capacity.
    GPUSpec(
        "a100-40gb",
        memory_bytes=_gib(39.39),
        hbm_bandwidth_bytes_per_s=1.555e12,
        fp16_flops=312e12,
        host_link_bytes_per_s=32e9,
        nvlink_bytes_per_s=300e9,
    ),
    # A100 SXM4 80GB: NVIDIA A100 datasheet (2,039 GB/s HBM2e, 312 TFLOPS, NVLink 600 GB/s,
    # PCIe gen4). Memory: torch reports 79.15 GiB total capacity.
    GPUSpec(
        "a100-80gb",
        memory_bytes=_gib(79.15),
        hbm_bandwidth_bytes_per_s=2.039e12,
        fp16_flops=312e12,
        host_link_bytes_per_s=32e9,
        nvlink_bytes_per_s=300e9,
    ),
    # H100 SXM5 80GB: NVIDIA H100 datasheet (3.35 TB/s HBM3, 989.4 TFLOPS fp16/bf16 dense,
    # NVLink 900 GB/s, PCIe gen5). Memory: 79.11 GiB total capacity (torch OOM message in
    # vllm-project/vllm#27508; other drivers report up to 79.22 GiB).
    GPUSpec(
        "h100-sxm",
        memory_bytes=_gib(79.11),
        hbm_bandwidth_bytes_per_s=3.35e12,
        fp16_flops=989.4e12,
        host_link_bytes_per_s=64e9,
        nvlink_bytes_per_s=450e9,
    ),
    # H100 PCIe 80GB: NVIDIA H100 datasheet (2.0 TB/s HBM2e, 756 TFLOPS fp16/bf16 dense,
    # NVLink bridge 600 GB/s, PCIe gen5). Memory: same 81,559 MiB part as the SXM card,
    # assumed to report the same 79.11 GiB.
    GPUSpec(
        "h100-pcie",
        memory_bytes=_gib(79.11),
        hbm_bandwidth_bytes_per_s=2.0e12,
        fp16_flops=756e12,
        host_link_bytes_per_s=64e9,
        nvlink_bytes_per_s=300e9,
    ),
    # H200 SXM 141GB: NVIDIA H200 datasheet (4.8 TB/s HBM3e, 989.4 TFLOPS fp16/bf16 dense,
    # NVLink 900 GB/s, PCIe gen5). Memory: torch reports 139.81 GiB total capacity.
    GPUSpec(
        "h200",
        memory_bytes=_gib(139.81),
        hbm_bandwidth_bytes_per_s=4.8e12,
        fp16_flops=989.4e12,
        host_link_bytes_per_s=64e9,
        nvlink_bytes_per_s=450e9,
    ),
    # L40S 48GB: NVIDIA L40S datasheet (864 GB/s GDDR6, 362.05 TFLOPS fp16/bf16 dense, PCIe
    # gen4, no NVLink). Memory: torch reports 44.40 GiB (46,068 MiB card with ECC on).
    GPUSpec(
        "l40s",
        memory_bytes=_gib(44.40),
        hbm_bandwidth_bytes_per_s=864e9,
        fp16_flops=362.05e12,
        host_link_bytes_per_s=32e9,
    ),
    # A10G 24GB (AWS g5): NVIDIA publishes no A10G datasheet; bandwidth 600 GB/s GDDR6 (AWS g5
    # page) and 125 TFLOPS fp16 dense from the NVIDIA A10 datasheet, its sibling. PCIe gen4,
    # no NVLink. Memory: torch reports 22.06 GiB on g5 instances.
    GPUSpec(
        "a10g",
        memory_bytes=_gib(22.06),
        hbm_bandwidth_bytes_per_s=600e9,
        fp16_flops=125e12,
        host_link_bytes_per_s=32e9,
    ),
    # A40 48GB: NVIDIA A40 datasheet (696 GB/s GDDR6, 149.7 TFLOPS fp16/bf16 dense, NVLink
    # bridge 112.5 GB/s bidirectional, PCIe gen4). Memory: the same 46,068 MiB GDDR6 with ECC
    # as the L40S, assumed to report the same 44.40 GiB.
    GPUSpec(
        "a40",
        memory_bytes=_gib(44.40),
        hbm_bandwidth_bytes_per_s=696e9,
        fp16_flops=149.7e12,
        host_link_bytes_per_s=32e9,
        nvlink_bytes_per_s=56.25e9,
    ),
    # L4 24GB: NVIDIA L4 datasheet (300 GB/s GDDR6, 121 TFLOPS fp16/bf16 dense (242 with
    # sparsity), PCIe gen4 x16, no NVLink). Memory: 23,034 MiB with ECC on; torch's OOM
    # messages on L4 cards report 22.03 GiB total capacity.
    GPUSpec(
        "l4",
        memory_bytes=_gib(22.03),
        hbm_bandwidth_bytes_per_s=300e9,
        fp16_flops=121e12,
        host_link_bytes_per_s=32e9,
    ),
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in _MODEL_LIST}
GPUS: dict[str, GPUSpec] = {g.name: g for g in _GPU_LIST}
