"""The analytical (roofline) cost model: step time from a ModelSpec and a GPUSpec.

The default when no calibration profile exists for a (GPU, model) pair. A step is the sum of

    overhead    fixed per-step host time + a per-request term (scheduling, input prep, sampling)
    layers      a fixed time per decoder layer (the latency of its dozen kernels)
    linear      max(weight bytes / memory rate, GEMM FLOPs / compute rate) over all layers + lm_head
    attention   decode group and each prefill entry: max(KV bytes / memory rate,
                attention FLOPs / compute rate), the KV bytes inflated by a per-block cost
    allreduce   tensor parallel only: 2 all-reduces per layer over the step's hidden states,
                each a ring: latency + 2 (tp - 1) / tp * bytes / (link rate * efficiency)
    swap, copy  bytes over the host link (swap preemption), copy-on-write block copies in HBM

The terms are added, not overlapped: a step's kernels run one after another on one stream.
Every constant lives in `AnalyticalConstants` with its source; "assumption" means exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagesim.config import KV_CACHE_DTYPES
from pagesim.cost.base import BatchShape, OneKindShapes
from pagesim.cost.moe import MoELinear
from pagesim.errors import ConfigError
from pagesim.specs import GPUSpec, ModelSpec

BREAKDOWN_KEYS: tuple[str, ...] = (
    "overhead",
    "layers",
    "linear",
    "attention",
    "paged_blocks",
    "allreduce",
    "swap",
    "copy",
)


@dataclass(frozen=True)
class AnalyticalConstants:
    """Efficiencies and fixed costs of the roofline, each with where it comes from."""

    # The efficiencies, the per-layer time, the host terms and the all-reduce terms are fitted
    # to pagesim's own runner on three H200 profiles (docs/cost_model.md, "Analytical", says
    # on what, with what error, and the fitted values these are rounded from); on another GPU
    # they are taken as the same shares of its datasheet rates, an assumption until a profile
    # of that GPU exists.

    # Share of the datasheet HBM bandwidth reached when streaming weights (GEMV-like decode),
    # bounded by the share a straight device copy reaches; the fit sits at that bound.
    weight_bandwidth_efficiency: float = 0.90
    # Share of the dense fp16/bf16 peak reached by the step's GEMMs (fitted).
    gemm_flops_efficiency: float = 0.59
    # Share of the HBM bandwidth reached by paged decode attention before the per-block cost
    # below. Bounded by the copy ceiling like the weights; the fit sits at it.
    attention_bandwidth_efficiency: float = 0.90
    # Share of peak FLOPs reached by prefill attention (fitted): the paged prefill kernel
    # gathers K/V through the block table and is not FlashAttention.
    attention_flops_efficiency: float = 0.25
    # Per KV block read, the kernel pays a fixed cost (a block-table load, then a dependent
    # address computation before the K/V loads issue, one more loop iteration), counted as the
    # time to read this many extra tokens of K/V: block size 16 costs 4/16 = 25 % over
    # contiguous K/V, in line with the vLLM paper's PagedAttention kernel against
    # FasterTransformer (Kwon et al., SOSP 2023, section 7.1). It inflates memory time only,
    # so compute-bound prefill attention is unaffected. Not fitted (the fit uses block 16).
    paged_block_overhead_tokens: float = 4.0
    # Fixed time per decoder layer per step, whatever the batch (fitted): each layer runs a
    # dozen kernels, each with a latency of its own even inside a CUDA graph, which the
    # roofline has no term for. It is most of a small decode step.
    per_layer_overhead_s: float = 115e-6
    # Host time per step (scheduler, input preparation, graph launch) and per scheduled
    # request (block-table rows, sampling), a line fitted to the profiles' host-overhead
    # tables. A profile's own overhead.csv replaces them.
    step_overhead_s: float = 0.14e-3
    per_request_overhead_s: float = 4.1e-6
    # Share of the host-link peak reached by pinned-memory swap copies (an assumption: PCIe
    # copies typically reach ~80 % of the link's per-direction peak).
    host_link_efficiency: float = 0.80
    # Latency of one small all-reduce between GPUs of one node, and the share of the
    # per-direction link rate that a large one reaches as NCCL "bus bandwidth" (busbw =
    # bytes / time * 2 (tp - 1) / tp), fitted to the all-reduce table of 2 x H200 over NVLink.
    # The latency is held constant in tp (NCCL's small-message protocols, not a ring); TP 4
    # and 8 are unmeasured. A measured allreduce.csv replaces both.
    allreduce_latency_s: float = 32.0e-6
    allreduce_bandwidth_efficiency: float = 0.72

    def __post_init__(self) -> None:
        for name in (
            "weight_bandwidth_efficiency",
            "gemm_flops_efficiency",
            "attention_bandwidth_efficiency",
            "attention_flops_efficiency",
            "host_link_efficiency",
            "allreduce_bandwidth_efficiency",
        ):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ConfigError(f"{name}={value!r}: must be in (0, 1]")
        for name in (
            "paged_block_overhead_tokens",
            "per_layer_overhead_s",
            "step_overhead_s",
            "per_request_overhead_s",
            "allreduce_latency_s",
        ):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ConfigError(f"{name}={value!r}: must be >= 0")


def kv_dtype_bytes(model: ModelSpec, kv_cache_dtype: str) -> int:
    """Bytes per KV element: the model's dtype for "auto", one byte for the fp8 formats."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"kv_cache_dtype={kv_cache_dtype!r}: choose one of {', '.join(KV_CACHE_DTYPES)}"
        )
    return model.dtype_bytes if kv_cache_dtype == "auto" else 1


def num_allreduces_per_step(model: ModelSpec, tensor_parallel_size: int) -> int:
    """All-reduces of `[tokens, hidden]` per step: two per layer under TP, none without."""
    return 2 * model.num_layers if tensor_parallel_size > 1 else 0


def matmul_params_per_layer(model: ModelSpec) -> int:
    """Weights that one decoder layer multiplies (projections and MLP; norms are negligible)."""
    q_out = model.num_attention_heads * model.head_size
    kv_out = model.num_kv_heads * model.head_size
    attn = model.hidden_size * (q_out + 2 * kv_out) + q_out * model.hidden_size
    mlp_mats = 3 if model.arch == "llama" else 2  # SwiGLU gate/up/down vs fc1/fc2
    return attn + mlp_mats * model.hidden_size * model.intermediate_size


class AnalyticalCostModel(OneKindShapes):
    """Roofline step time for `model` on `gpu` with tensor parallelism `tensor_parallel_size`.

    Per GPU, weights, attention heads and the lm_head are divided by the TP degree (Megatron-LM
    layout, Shoeybi et al. 2019); KV heads are divided too but never below one (vLLM replicates
    KV heads when there are fewer than GPUs). Two all-reduces per layer (after the attention
    output projection and after the MLP) move the step's hidden states,
    `bytes = tokens * hidden_size * dtype_bytes` each: ring time
    `2 (tp - 1) / tp * bytes / (link * allreduce_bandwidth_efficiency)` (NCCL's bus-bandwidth
    formula) plus `allreduce_latency_s`, over NVLink (`GPUSpec.nvlink_bytes_per_s`, one
    direction), or over the host link on GPUs without one. Not counted (under 1 % of the
    all-reduce time of an 80-layer model): the vocab-parallel embedding's all-reduce and the
    all-gather of the logits (`num_reqs * vocab * 4` bytes).
    """

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        tensor_parallel_size: int = 1,
        kv_cache_dtype: str = "auto",
        constants: AnalyticalConstants | None = None,
    ):
        tp = tensor_parallel_size
        if tp < 1:
            raise ConfigError(f"tensor_parallel_size={tp!r}: must be >= 1")
        if model.num_attention_heads % tp:
            raise ConfigError(
                f"tensor_parallel_size={tp}: must divide num_attention_heads="
                f"{model.num_attention_heads} of {model.name}"
            )
        if model.num_kv_heads >= tp and model.num_kv_heads % tp:
            raise ConfigError(
                f"tensor_parallel_size={tp}: must divide num_kv_heads="
                f"{model.num_kv_heads} of {model.name}"
            )
        self.model, self.gpu, self.tensor_parallel_size = model, gpu, tp
        self.kv_cache_dtype = kv_cache_dtype
        c = self.constants = constants or AnalyticalConstants()
        mem_w = gpu.hbm_bandwidth_bytes_per_s * c.weight_bandwidth_efficiency
        mem_a = gpu.hbm_bandwidth_bytes_per_s * c.attention_bandwidth_efficiency
        gemm = gpu.fp16_flops * c.gemm_flops_efficiency
        attn_flops = gpu.fp16_flops * c.attention_flops_efficiency
        layers = model.num_layers
        layer_params = matmul_params_per_layer(model) * layers / tp
        lm_head_params = model.vocab_size * model.hidden_size / tp
        # ---- per-GPU constants, in seconds per unit of work ----
        self._layers_s = layers * c.per_layer_overhead_s
        self._weights_s = (layer_params + lm_head_params) * model.dtype_bytes / mem_w
        self._gemm_s_per_token = 2.0 * layer_params / gemm
        self._lm_head_s_per_req = 2.0 * lm_head_params / gemm  # vLLM: logits for 1 row per req
        kv_heads = max(1, model.num_kv_heads // tp)
        kv_bytes_per_token = (
            2 * layers * kv_heads * model.head_size * kv_dtype_bytes(model, kv_cache_dtype)
        )  # K and V, all layers, this GPU
        self._attn_s_per_qk = (
            4.0 * layers * (model.num_attention_heads / tp) * model.head_size / attn_flops
        )  # per (query token, key token) pair
        self._prefill_attn_s_per_qk = self._attn_s_per_qk
        if model.kv_lora_rank is not None:
            # MLA: the cache is one latent + rope vector per token and layer, whole on every
            # GPU. Decode absorbs the up-projections: per head, QK over rank + rope and PV over
            # rank. Prefill expands K/V: QK over nope + rope (head_size), PV over v_head_dim.
            latent = model.kv_lora_rank + model.qk_rope_head_dim
            kv_bytes_per_token = layers * latent * kv_dtype_bytes(model, kv_cache_dtype)
            heads = model.num_attention_heads / tp
            self._attn_s_per_qk = 2.0 * layers * heads * (latent + model.kv_lora_rank) / attn_flops
            self._prefill_attn_s_per_qk = (
                2.0 * layers * heads * (model.head_size + model.v_head_dim) / attn_flops
            )
        self.kv_bytes_per_token = kv_bytes_per_token
        self._kv_s_per_token = kv_bytes_per_token / mem_a
        self._block_tokens = c.paged_block_overhead_tokens
        self._copy_s_per_token = 2.0 * kv_bytes_per_token / mem_w  # read + write
        self._swap_s_per_byte = 1.0 / (gpu.host_link_bytes_per_s * c.host_link_efficiency)
        link = (
            gpu.nvlink_bytes_per_s or gpu.host_link_bytes_per_s
        ) * c.allreduce_bandwidth_efficiency
        self.num_allreduces = num_allreduces_per_step(model, tp)
        self.allreduce_bytes_per_token = model.hidden_size * model.dtype_bytes
        self._ar_fixed_s = self.num_allreduces * c.allreduce_latency_s
        self._ar_s_per_token = (
            self.num_allreduces * 2.0 * (tp - 1) / tp * self.allreduce_bytes_per_token / link
        )
        self._window = model.uniform_window
        self._moe = MoELinear.of(model, tp) if model.is_moe else None
        self._mem_w, self._gemm = mem_w, gemm
        self._lm_head_params = lm_head_params

    # ---- public API ----
    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one step; the sum of `step_time_breakdown`'s values."""
        return sum(self._components(batch))

    def step_time_breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per component, keyed by `BREAKDOWN_KEYS`."""
        return dict(zip(BREAKDOWN_KEYS, self._components(batch), strict=True))

    def allreduce_time(self, num_tokens: int) -> float:
        """Seconds of a step's all-reduces over `num_tokens` tokens (0 at TP 1 or 0 tokens)."""
        return (self._ar_fixed_s + self._ar_s_per_token * num_tokens) if num_tokens else 0.0

    # ---- the model ----
    def _components(self, b: BatchShape) -> tuple[float, ...]:
        c = self.constants
        n_reqs = b.num_decode_seqs + len(b.prefill_new_tokens)
        overhead = c.step_overhead_s + c.per_request_overhead_s * n_reqs
        tokens = b.total_tokens
        layers = self._layers_s if tokens else 0.0
        if tokens and self._moe is not None:
            linear = self._moe_linear(tokens, n_reqs)
        elif tokens:
            linear = max(
                self._weights_s, self._gemm_s_per_token * tokens + self._lm_head_s_per_req * n_reqs
            )
        else:
            linear = 0.0
        attn, paged = self._attention(b)
        allreduce = self.allreduce_time(tokens)
        swap = b.swap_bytes * self._swap_s_per_byte
        copy = b.num_blocks_to_copy * b.block_size * self._copy_s_per_token
        return overhead, layers, linear, attn, paged, allreduce, swap, copy

    def _moe_linear(self, tokens: int, n_reqs: int) -> float:
        """Roofline of an MoE step's linear layers: the experts it touches, read once, against
        the routed GEMM work with its per-expert padding (`pagesim.cost.moe`)."""
        moe = self._moe
        assert moe is not None
        model = self.model
        read = moe.weight_bytes_read(tokens, model.dtype_bytes, model.expert_bytes_per_param)
        weights = (read + self._lm_head_params * model.dtype_bytes) / self._mem_w
        gemm = 2.0 * moe.gemm_params_rows(tokens) / self._gemm + self._lm_head_s_per_req * n_reqs
        return max(weights, gemm)

    def _attention(self, b: BatchShape) -> tuple[float, float]:
        """(attention without the per-block cost, the per-block cost) in seconds.

        Roofline of the decode group (memory-bound for any real model, so equal to the sum of
        per-sequence rooflines) plus one roofline per prefill entry. Per entry rather than per
        group so that the model stays monotone: a sequence that turns from decode into prefill
        (two new tokens instead of one) can never hide its K/V reads behind another entry's
        FLOPs. Blocks touched by a sequence of `kv` tokens: ceil(kv / bs), taken in expectation
        over a uniform fill of the last block, `kv / bs + (bs - 1) / (2 bs)`, so that no
        per-sequence pass is needed on the hot path.
        """
        bs = b.block_size
        partial = (bs - 1) / (2.0 * bs)
        attn = paged = 0.0
        n = b.num_decode_seqs
        if n:
            kv = self._windowed_sum(b.decode_context_tokens, b.decode_context_sum) + n
            blocks = kv / bs + n * partial
            mem = (kv + n) * self._kv_s_per_token  # read kv tokens, write n
            mem_paged = mem + blocks * self._block_tokens * self._kv_s_per_token
            flops = kv * self._attn_s_per_qk
            base = mem if mem > flops else flops
            attn += base
            paged += max(mem_paged, flops) - base
        kv_s, block_s = self._kv_s_per_token, self._block_tokens * self._kv_s_per_token
        for q, ctx in zip(b.prefill_new_tokens, b.prefill_context_tokens, strict=True):
            visible = ctx if self._window is None else min(ctx, self._window)
            mem = (visible + 2 * q) * kv_s  # read prefix and chunk, write the chunk
            flops = (q * visible + q * (q + 1) / 2.0) * self._prefill_attn_s_per_qk  # causal
            base = mem if mem > flops else flops
            attn += base
            paged += max(mem + ((visible + q) / bs + partial) * block_s, flops) - base
        return attn, paged

    def _windowed_sum(self, contexts: Sequence[int], total: int) -> int:
        """Sum of contexts capped at the sliding window (one pass only for windowed models)."""
        if self._window is None:
            return total
        w = self._window
        return sum(c if c < w else w for c in contexts)
