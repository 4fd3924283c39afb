"""Frozen model and GPU specs, looked up by name.

Every value carries its source in a comment. Lookups that miss raise one line listing the known
names (`ModelSpec.from_name("llama-9b")`).
"""

from __future__ import annotations

import math
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

    @property
    def uniform_window(self) -> int | None:
        """The window when every layer slides (Mistral), else None: a hybrid model's steps
        are planned and priced as full attention on every layer (its sliding layers read at
        most the window), as one block table shares them."""
        return None if self.is_hybrid else self.sliding_window

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
# Columns: name, arch, num_layers, hidden_size, num_attention_heads, num_kv_heads, head_size,
# intermediate_size (OPT: ffn_dim), vocab_size, max_position_embeddings, num_params.
# fmt: off
_MODEL_LIST: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-2-{7b,13b,70b}-hf config.json (float16; 70b: GQA with 8 KV heads)
    ModelSpec("llama-2-7b",    "llama", 32, 4096,  32, 32, 128, 11008, 32000,  4096,   6_738_415_616, hf_id="meta-llama/Llama-2-7b-hf"),
    ModelSpec("llama-2-13b",   "llama", 40, 5120,  40, 40, 128, 13824, 32000,  4096,  13_015_864_320, hf_id="meta-llama/Llama-2-13b-hf"),
    ModelSpec("llama-2-70b",   "llama", 80, 8192,  64, 8,  128, 28672, 32000,  4096,  68_976_648_192, hf_id="meta-llama/Llama-2-70b-hf"),
    # meta-llama/Meta-Llama-3-{8B,70B} config.json (bfloat16): 70B is Llama 2 70B's layer
    # shapes with a 128,256-token vocabulary and an 8k context.
    ModelSpec("llama-3-8b",    "llama", 32, 4096,  32, 8,  128, 14336, 128256, 8192,   8_030_261_248, hf_id="meta-llama/Meta-Llama-3-8B"),
    ModelSpec("llama-3-70b",   "llama", 80, 8192,  64, 8,  128, 28672, 128256, 8192,  70_553_706_496, hf_id="meta-llama/Meta-Llama-3-70B"),
    # meta-llama/Llama-3.1-{8B,70B} config.json (bfloat16; rope_scaling "llama3", 128k
    # context): Llama 3's shapes with a longer context.
    ModelSpec("llama-3.1-8b",  "llama", 32, 4096,  32, 8,  128, 14336, 128256, 131072,  8_030_261_248, hf_id="meta-llama/Llama-3.1-8B"),
    ModelSpec("llama-3.1-70b", "llama", 80, 8192,  64, 8,  128, 28672, 128256, 131072, 70_553_706_496, hf_id="meta-llama/Llama-3.1-70B"),
    # mistralai/Mistral-7B-v0.1 config.json (bfloat16): Llama 3 8B's layer shapes with a
    # 32,000-token vocabulary and sliding_window 4096 on every layer.
    ModelSpec("mistral-7b",    "llama", 32, 4096,  32, 8,  128, 14336, 32000,  32768,  7_241_732_096, sliding_window=4096, hf_id="mistralai/Mistral-7B-v0.1"),
    # facebook/opt-{13b,66b} config.json (float16; learned positions with 2 offset rows, tied
    # LM head, biases everywhere). OPT-175B has no public HF config: OPT paper (Zhang et al.
    # 2022, arXiv:2205.01068) Table 1 (96 layers, 96 heads, d_model 12288, ffn 4 * d_model,
    # 2048 context) with OPT's 50272-entry vocabulary.
    ModelSpec("opt-13b",       "opt",   40, 5120,  40, 40, 128, 20480, 50272,  2048,  12_853_473_280, hf_id="facebook/opt-13b"),
    ModelSpec("opt-66b",       "opt",   64, 9216,  72, 72, 128, 36864, 50272,  2048,  65_719_701_504, hf_id="facebook/opt-66b"),
    ModelSpec("opt-175b",      "opt",   96, 12288, 96, 96, 128, 49152, 50272,  2048, 174_604_468_224, hf_id="facebook/opt-175b"),
    # Qwen/Qwen2.5-7B config.json (bfloat16; untied LM head, q/k/v biases; the Instruct
    # variant's config.json says max_position_embeddings 32768). arch "llama": Qwen2 is Llama
    # plus q/k/v biases, which the serving cost model can ignore.
    ModelSpec("qwen2.5-7b",    "llama", 28, 3584,  28, 4,  128, 18944, 152064, 131072,  7_615_616_512, hf_id="Qwen/Qwen2.5-7B"),
    # A tiny Llama-shaped model with random weights, for CPU tests of the GPU runner.
    ModelSpec("tiny-llama",    "llama", 2,  128,   4,  2,  32,  256,   512,    2048,         426_624),
)
# fmt: on

# ---------------------------------------------------------------------------------------------
# GPUs. `memory_bytes` is the total that the CUDA runtime reports (torch.cuda.mem_get_info()[1],
# the "total capacity" of torch's OOM message), which is what vLLM multiplies by
# gpu_memory_utilization; it is a little below the marketing figure. Rates are NVIDIA datasheet
# peaks: dense fp16/bf16 tensor-core FLOP/s (without 2:4 sparsity), HBM/GDDR bandwidth in
# decimal bytes/s. Host link: one direction of the card's PCIe x16 link at its nominal rate
# (gen4: 64 GB/s bidirectional -> 32e9 per direction; gen5: 128 GB/s -> 64e9); measured
# pinned-memory copies reach ~80% of it. NVLink: half the datasheet's bidirectional total.
# ---------------------------------------------------------------------------------------------
# Columns: name, memory_bytes, hbm_bandwidth_bytes_per_s, fp16_flops, host_link_bytes_per_s,
# nvlink_bytes_per_s.
_GPU_LIST: tuple[GPUSpec, ...] = (
    # A100 SXM4 40GB: NVIDIA A100 datasheet (1,555 GB/s HBM2, 312 TFLOPS fp16/bf16 dense,
    # NVLink 600 GB/s, PCIe gen4). Memory: torch reports 39.39 GiB total capacity.
    GPUSpec("a100-40gb", _gib(39.39), 1.555e12, 312e12, 32e9, 300e9),
    # A100 SXM4 80GB: NVIDIA A100 datasheet (2,039 GB/s HBM2e, 312 TFLOPS, NVLink 600 GB/s,
    # PCIe gen4). Memory: torch reports 79.15 GiB total capacity.
    GPUSpec("a100-80gb", _gib(79.15), 2.039e12, 312e12, 32e9, 300e9),
    # H100 SXM5 80GB: NVIDIA H100 datasheet (3.35 TB/s HBM3, 989.4 TFLOPS fp16/bf16 dense,
    # NVLink 900 GB/s, PCIe gen5). Memory: 79.11 GiB total capacity (torch OOM message in
    # vllm-project/vllm#27508; other drivers report up to 79.22 GiB).
    GPUSpec("h100-sxm", _gib(79.11), 3.35e12, 989.4e12, 64e9, 450e9),
    # H100 PCIe 80GB: NVIDIA H100 datasheet (2.0 TB/s HBM2e, 756 TFLOPS fp16/bf16 dense,
    # NVLink bridge 600 GB/s, PCIe gen5). Memory: same 81,559 MiB part as the SXM card,
    # assumed to report the same 79.11 GiB.
    GPUSpec("h100-pcie", _gib(79.11), 2.0e12, 756e12, 64e9, 300e9),
    # H200 SXM 141GB: NVIDIA H200 datasheet (4.8 TB/s HBM3e, 989.4 TFLOPS fp16/bf16 dense,
    # NVLink 900 GB/s, PCIe gen5). Memory: torch reports 139.81 GiB total capacity.
    GPUSpec("h200", _gib(139.81), 4.8e12, 989.4e12, 64e9, 450e9),
    # L40S 48GB: NVIDIA L40S datasheet (864 GB/s GDDR6, 362.05 TFLOPS fp16/bf16 dense, PCIe
    # gen4, no NVLink). Memory: torch reports 44.40 GiB (46,068 MiB card with ECC on).
    GPUSpec("l40s", _gib(44.40), 864e9, 362.05e12, 32e9),
    # A10G 24GB (AWS g5): NVIDIA publishes no A10G datasheet; bandwidth 600 GB/s GDDR6 (AWS g5
    # page) and 125 TFLOPS fp16 dense from the NVIDIA A10 datasheet, its sibling. PCIe gen4,
    # no NVLink. Memory: torch reports 22.06 GiB on g5 instances.
    GPUSpec("a10g", _gib(22.06), 600e9, 125e12, 32e9),
    # A40 48GB: NVIDIA A40 datasheet (696 GB/s GDDR6, 149.7 TFLOPS fp16/bf16 dense, NVLink
    # bridge 112.5 GB/s bidirectional, PCIe gen4). Memory: the same 46,068 MiB GDDR6 with ECC
    # as the L40S, assumed to report the same 44.40 GiB.
    GPUSpec("a40", _gib(44.40), 696e9, 149.7e12, 32e9, 56.25e9),
    # L4 24GB: NVIDIA L4 datasheet (300 GB/s GDDR6, 121 TFLOPS fp16/bf16 dense (242 with
    # sparsity), PCIe gen4 x16, no NVLink). Memory: 23,034 MiB with ECC on; torch's OOM
    # messages on L4 cards report 22.03 GiB total capacity.
    GPUSpec("l4", _gib(22.03), 300e9, 121e12, 32e9),
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in _MODEL_LIST}


def shipped_spec(name: str) -> ModelSpec | None:
    """The spec of a shipped model (hand-written or a shipped config) by its name, or None:
    what a calibration profile's recorded model name stands for."""
    if name in MODELS:
        return MODELS[name]
    from pagesim.hf_config import resolve_model, shipped_models  # it builds on this module

    return resolve_model(name) if name in shipped_models() else None


GPUS: dict[str, GPUSpec] = {g.name: g for g in _GPU_LIST}
