"""KV cache sizing: bytes per token and per block, and how many blocks one GPU holds.

The arithmetic is vLLM v1's startup (`gpu_worker.determine_available_memory`,
`kv_cache_utils.get_kv_cache_configs`), per GPU:

    requested      = ceil(GPU memory * gpu_memory_utilization)
    available_kv   = requested - weights / tp - activation peak - non-torch memory
    num_gpu_blocks = available_kv // page_size_bytes          (page = one block, all layers)

vLLM measures the activation peak and the non-torch memory with a profile run; pagesim has no
GPU at planning time, so `estimate_non_kv_memory` estimates them (sources at the constants)
and `kv_capacity(config, non_kv=...)` takes a measured `NonKVMemory` instead. Two settings
bypass the estimate as in vLLM: `kv_cache_memory_bytes` (the KV budget itself) and
`num_gpu_blocks_override` (the block count itself; pagesim then skips every memory check, so
a small override is a cheap way to test preemption on any model).

Units: bytes and tokens; "per GPU" everywhere (with tensor parallelism each GPU holds
max(1, num_kv_heads // tp) KV heads of every layer, as vLLM shards them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.specs import GiB, ModelSpec

MiB = 1024**2

# ---- estimates of what vLLM's profile run measures (replace with measured values) ----------
# Non-torch memory that appears during the profile run on one GPU (cuBLAS workspaces,
# attention-backend buffers). vLLM's own log (vllm-project/vllm#12126, H100, Llama-3.2-11B):
# "non_torch_memory takes 0.16GiB"; rounded up.
NON_TORCH_BYTES = 256 * MiB
# No term for NCCL's buffers under tensor parallelism: vLLM v1's worker starts the distributed
# environment (NCCL communicators, custom all-reduce buffers) before it takes the memory
# snapshot its budget counts from (`gpu_worker.init_device`, 0.33.0), so they sit in the
# baseline, outside `requested`'s accounting. (vllm-project/vllm#10511 counted 1.75 GiB more
# at tp=2 on an older worker that took the snapshot first.) Checked on 2 x H200 at TP 2
# (docs/tensor_parallel.md, "KV capacity").
# Bytes per logit alive at the sampler's peak: the fp32 logits plus two fp32 temporaries
# (probabilities, log-probabilities) over [min(max_num_seqs, max_num_batched_tokens), vocab].
LOGITS_BYTES_PER_ELEMENT = 12
# Activations: residual + hidden stream [T, hidden] and the MLP intermediates (gate_up output
# [T, 2 * I / tp] and activation output [T, I / tp] for SwiGLU; fc1 output and GELU output
# [T, I / tp] each for OPT), in the model dtype, T = max_num_batched_tokens. Against the
# Llama-3-8B profile in vllm-project/vllm#10511 (T=8192, 256 sequences, measured 1.26 GiB),
# this estimate gives 1.15 GiB.

KVSource = Literal["gpu_memory_utilization", "kv_cache_memory_bytes", "num_gpu_blocks_override"]


def kv_cache_dtype_bytes(model: ModelSpec, kv_cache_dtype: str = "auto") -> int:
    """Bytes per cached K or V element: the model dtype for "auto", 1 for any fp8 variant."""
    if kv_cache_dtype == "auto":
        return model.dtype_bytes
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in ("bfloat16", "float16", "half"):
        return 2
    raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r}: choose auto, fp8, fp8_e4m3, fp8_e5m2")


def num_kv_heads_per_gpu(model: ModelSpec, tensor_parallel_size: int = 1) -> int:
    """KV heads each GPU holds: max(1, num_kv_heads // tp) (heads are replicated past tp)."""
    return max(1, model.num_kv_heads // tensor_parallel_size)


def kv_bytes_per_token_per_layer(
    model: ModelSpec, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
) -> int:
    """What one token caches in one layer on one GPU (vLLM's page_size_bytes / block_size).

    Plain attention: K and V, 2 * kv_heads_per_gpu * head_size * dtype_bytes. MLA
    (DeepSeek): the compressed latent plus the rope part of the key, one vector of
    kv_lora_rank + qk_rope_head_dim per token (vLLM's MLAAttentionSpec: one KV head, no
    separate V), held whole on every GPU under tensor parallelism.
    """
    dtype = kv_cache_dtype_bytes(model, kv_cache_dtype)
    if model.kv_lora_rank is not None:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * dtype
    return 2 * num_kv_heads_per_gpu(model, tensor_parallel_size) * model.head_size * dtype


def kv_bytes_per_token(
    model: ModelSpec, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
) -> int:
    """What one token caches over all layers on one GPU (every layer holding it)."""
    return model.num_layers * kv_bytes_per_token_per_layer(
        model, kv_cache_dtype, tensor_parallel_size
    )


class KVCacheGroup(NamedTuple):
    """Layers that share one block table (vLLM's KVCacheGroupSpec): one attention kind."""

    kind: str  # "full" or "sliding"
    num_layers: int  # layers whose pages one block holds (padding layers included)


def kv_cache_groups(model: ModelSpec, hybrid_kv_cache_manager: bool = False) -> list[KVCacheGroup]:
    """The KV cache groups vLLM forms over one block pool
    (`kv_cache_planning._get_kv_cache_groups_uniform_page_size`, 0.33).

    A model with one attention kind is one group of all layers. A hybrid model's layers are
    bucketed by kind; every group holds `group_size` layers, the smallest bucket's size
    (the largest's when it is under 1.5 times the smallest, to pad less), and each bucket
    is split into ceil(len / group_size) groups, the last one padded. Without the hybrid
    manager (vLLM's --disable-hybrid-kv-cache-manager) sliding layers are served as full
    attention in one group.
    """
    kinds = model.attention_kinds
    if not hybrid_kv_cache_manager and model.is_hybrid:
        return [KVCacheGroup("full", len(kinds))]
    buckets = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
    smallest, largest = min(buckets.values()), max(buckets.values())
    size = largest if largest < 1.5 * smallest else smallest
    return [
        KVCacheGroup(kind, size)
        for kind, count in buckets.items()
        for _ in range(-(-count // size))
    ]


def page_size_bytes(
    model: ModelSpec,
    block_size: int,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    hybrid_kv_cache_manager: bool = False,
) -> int:
    """One block of the pool on one GPU: block_size tokens of every layer of the largest
    KV cache group (vLLM's bytes_per_block; all layers for a model of one attention kind)."""
    per_layer = block_size * kv_bytes_per_token_per_layer(
        model, kv_cache_dtype, tensor_parallel_size
    )
    groups = kv_cache_groups(model, hybrid_kv_cache_manager)
    return per_layer * max(g.num_layers for g in groups)


def blocks_per_request(
    model: ModelSpec,
    num_tokens: int,
    block_size: int,
    max_num_batched_tokens: int,
    hybrid_kv_cache_manager: bool = False,
) -> int:
    """Most blocks one request of `num_tokens` holds at once (vLLM's max_memory_usage_bytes),
    summed over the KV cache groups, which all draw from one pool.

    Full attention: ceil(num_tokens / block_size). Sliding window W: the last W - 1 computed
    tokens plus one step's new tokens, min(W - 1 + max_num_batched_tokens, num_tokens), plus
    one block because the window need not start at a block boundary.
    """
    full = -(-num_tokens // block_size)
    if model.sliding_window is None:
        return full
    tokens = min(model.sliding_window - 1 + max_num_batched_tokens, num_tokens)
    sliding = -(-tokens // block_size) + 1
    groups = kv_cache_groups(model, hybrid_kv_cache_manager)
    return sum(full if g.kind == "full" else sliding for g in groups)


def max_concurrency(num_gpu_blocks: int, blocks_per_req: int) -> float:
    """Requests that fit at once if each holds `blocks_per_req` blocks (vLLM's figure:
    num_gpu_blocks / ceil(max_model_len / block_size) for full attention)."""
    return num_gpu_blocks / blocks_per_req


@dataclass(frozen=True)
class NonKVMemory:
    """What one GPU spends outside the KV cache, bytes."""

    weights_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.activation_peak_bytes + self.non_torch_bytes


def estimate_activation_peak_bytes(
    model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int = 1
) -> int:
    """Peak torch memory of vLLM's profile run, estimated (see the constants above)."""
    t, tp, act = max_num_batched_tokens, tensor_parallel_size, model.dtype_bytes
    mlp_width = (
        3 * model.intermediate_size if model.arch == "llama" else 2 * model.intermediate_size
    )
    if model.is_moe:  # fused MoE: gate_up and activation outputs of every routed copy
        mlp_width = 3 * model.moe_intermediate_size * model.num_experts_per_tok
    forward = t * (2 * model.hidden_size + mlp_width // tp) * act
    logits = min(max_num_seqs, t) * model.vocab_size * LOGITS_BYTES_PER_ELEMENT
    return forward + logits


def estimate_non_kv_memory(config: EngineConfig) -> NonKVMemory:
    """Weights / tp, estimated activation peak and non-torch memory of one GPU."""
    model, tp = config.model_spec, config.tensor_parallel_size
    return NonKVMemory(
        weights_bytes=-(-model.weight_bytes // tp),
        activation_peak_bytes=estimate_activation_peak_bytes(
            model, config.max_num_batched_tokens, config.max_num_seqs, tp
        ),
        non_torch_bytes=NON_TORCH_BYTES,
    )


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache one engine gets, per GPU, and what it means for concurrency."""

    model: str
    gpu: str
    tensor_parallel_size: int
    block_size: int
    kv_cache_dtype: str
    max_model_len: int
    kv_bytes_per_token: int  # K+V (MLA: latent + rope), all layers, one GPU
    page_size_bytes: int  # one block of the pool: the largest KV cache group's layers
    available_kv_cache_memory_bytes: int
    num_gpu_blocks: int
    blocks_per_request: int  # at max_model_len
    source: KVSource  # which setting decided num_gpu_blocks
    non_kv: NonKVMemory | None  # None when kv_cache_memory_bytes or the override decided

    @property
    def num_tokens(self) -> int:
        """Tokens the cache holds: num_gpu_blocks * block_size (vLLM's "GPU KV cache size")."""
        return self.num_gpu_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return max_concurrency(self.num_gpu_blocks, self.blocks_per_request)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            num_tokens=self.num_tokens,
            max_concurrency=self.max_concurrency,
            available_kv_cache_memory_gib=self.available_kv_cache_memory_bytes / GiB,
        )
        return d

    def report(self) -> str:
        """The three lines of vLLM's startup log, in its format."""
        return (
            f"Available KV cache memory: {self.available_kv_cache_memory_bytes / GiB:.2f} GiB\n"
            f"GPU KV cache size: {self.num_tokens:,} tokens\n"
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x"
        )


def serves_hybrid(config: EngineConfig) -> bool:
    """Whether `config` is served with the hybrid KV cache manager: a hybrid model on the
    paged allocator (a contiguous baseline holds every layer in one region), unless
    `disable_hybrid_kv_cache_manager` serves its layers as full attention in one group."""
    return (
        config.allocator == "paged"
        and config.model_spec.is_hybrid
        and not config.disable_hybrid_kv_cache_manager
    )


def kv_capacity(config: EngineConfig, non_kv: NonKVMemory | None = None) -> KVCapacity:
    """Size the KV cache of `config` on one GPU. `non_kv` replaces the estimate if measured.

    A hybrid model's pool is sized in KV cache groups (`kv_cache_groups`) as vLLM's default
    does when `serves_hybrid`; with `disable_hybrid_kv_cache_manager` every layer is one
    full-attention group. Models of one attention kind size the same either way.

    Raises `ConfigError` (one line) when the weights do not fit, when nothing is left for the
    KV cache, or, as vLLM does, when one request of max_model_len does not fit.
    """
    model, gpu = config.model_spec, config.gpu_spec
    tp, bs = config.tensor_parallel_size, config.block_size
    hybrid = serves_hybrid(config)
    page = page_size_bytes(model, bs, config.kv_cache_dtype, tp, hybrid)
    per_req = blocks_per_request(
        model, config.max_model_len, bs, config.max_num_batched_tokens, hybrid
    )
    source: KVSource
    if config.num_gpu_blocks_override is not None:
        source, non_kv = "num_gpu_blocks_override", None
        blocks = config.num_gpu_blocks_override
        available = blocks * page
    else:
        if config.kv_cache_memory_bytes is not None:
            source, non_kv = "kv_cache_memory_bytes", None
            available = config.kv_cache_memory_bytes
        else:
            source = "gpu_memory_utilization"
            non_kv = non_kv or estimate_non_kv_memory(config)
            available = _available_from_utilization(config, non_kv)
        blocks = available // page
        _check_blocks(config, blocks, available, page, per_req)
    return KVCapacity(
        model=model.name,
        gpu=gpu.name,
        tensor_parallel_size=tp,
        block_size=bs,
        kv_cache_dtype=config.kv_cache_dtype,
        max_model_len=config.max_model_len,
        kv_bytes_per_token=kv_bytes_per_token(model, config.kv_cache_dtype, tp),
        page_size_bytes=page,
        available_kv_cache_memory_bytes=available,
        num_gpu_blocks=blocks,
        blocks_per_request=per_req,
        source=source,
        non_kv=non_kv,
    )


def _available_from_utilization(config: EngineConfig, non_kv: NonKVMemory) -> int:
    model, gpu, tp = config.model_spec, config.gpu_spec, config.tensor_parallel_size
    util = config.gpu_memory_utilization
    requested = math.ceil(gpu.memory_bytes * util)  # vLLM's request_memory
    where = (
        f"gpu_memory_utilization={util} of {gpu.name} "
        f"({requested / GiB:.1f} GiB per GPU, tensor_parallel_size={tp})"
    )
    if non_kv.weights_bytes >= requested:
        per_gpu = f", {non_kv.weights_bytes / GiB:.1f} GiB per GPU" if tp > 1 else ""
        raise ConfigError(
            f"weights of {model.name} ({model.weight_bytes / GiB:.1f} GiB{per_gpu}) do not "
            f"fit in {where}; "
            f"raise tensor_parallel_size or pick a larger GPU"
        )
    available = requested - non_kv.total_bytes
    if available <= 0:
        raise ConfigError(
            f"weights of {model.name} ({model.weight_bytes / GiB:.1f} GiB) leave no KV cache "
            f"memory in {where}: weights {non_kv.weights_bytes / GiB:.2f} GiB + activations "
            f"{non_kv.activation_peak_bytes / GiB:.2f} GiB + non-torch "
            f"{non_kv.non_torch_bytes / GiB:.2f} GiB per GPU; raise tensor_parallel_size or "
            f"gpu_memory_utilization"
        )
    return available


def _check_blocks(
    config: EngineConfig, blocks: int, available: int, page: int, per_req: int
) -> None:
    if blocks <= 0:
        raise ConfigError(
            f"KV cache memory of {available / GiB:.3f} GiB holds no block of {page:,} bytes "
            f"({config.model} block_size={config.block_size}); give the KV cache more memory"
        )
    if blocks < per_req:
        fits = blocks * config.block_size
        raise ConfigError(
            f"max_model_len={config.max_model_len} needs {per_req * page / GiB:.2f} GiB of KV "
            f"cache per request but {config.model} on {config.gpu} has "
            f"{available / GiB:.2f} GiB ({fits:,} tokens); lower max_model_len or give the "
            f"KV cache more memory"
        )


def num_gpu_blocks(config: EngineConfig) -> int:
    """Blocks in the KV cache of one GPU (the override, or what the memory budget holds)."""
    return kv_capacity(config).num_gpu_blocks
