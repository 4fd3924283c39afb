"""The non-attention kernels of one forward pass, with the work each does, and their roofline.

One decoder layer of the Llama family, as pagesim's runner (`pagesim.gpu.model`) and vLLM run
it, on `n` token rows of one tensor-parallel rank:

    input_layernorm  [n, h] -> [n, h]              element-wise / norm
    attn_pre_proj    [n, h] x [h, q + 2 kv]        GEMM (fused q, k, v)
    attn_rope        q and k rotated in place      element-wise
    attn_post_proj   [n, q] x [q, h]               GEMM
    add              residual + [n, h]             element-wise
    post_attention_layernorm                       element-wise / norm
    mlp_up_proj      [n, h] x [h, 2 i]             GEMM (fused gate and up)
    mlp_act          silu(gate) * up -> [n, i]     element-wise
    mlp_down_proj    [n, i] x [i, h]               GEMM
    add              residual + [n, h]             element-wise

(`q`, `kv`, `i`: this rank's shares of the query, key/value and MLP widths.) Once per step: the
LM head GEMM over one row per request, `[r, h] x [h, vocab / tp]`. OPT has the same GEMMs less
the gate (`fc1`, `fc2`) and no rotary embedding. Names are Vidur's (microsoft/vidur) for the
same operations, so its per-operation measurements compare one to one.

A kernel's time on a GPU is `latency + max(bytes / memory rate, FLOPs / GEMM rate)`: a
roofline plus the fixed time that any kernel takes however little it moves (launch, the ramp
up and the tail of its waves), the alpha-beta form of a latency-bandwidth model. It is
compute-bound when its arithmetic intensity (FLOPs per byte) exceeds the GPU's ridge point
(`BoundingRates.ridge_flops_per_byte`). The latency is taken the same on every GPU (an
assumption: it moves with the clock, which differs little between these GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from pagesim.cost.gpu_rates import BoundingRates
from pagesim.specs import ModelSpec

Family = Literal["gemm", "elementwise"]


class Operation(NamedTuple):
    """One kernel's work at a token count: FLOPs and bytes moved through memory."""

    name: str
    family: Family
    runs: int  # how many times a step runs it (layers, or 1)
    flops: float  # per run
    bytes: float  # per run: read + written


@dataclass(frozen=True)
class LayerWidths:
    """One tensor-parallel rank's widths of a model (Megatron-LM layout, as vLLM shards it)."""

    hidden: int
    q: int  # query heads x head size on this rank
    kv: int  # key (= value) heads x head size on this rank; at least one head
    mlp: int  # MLP intermediate width on this rank
    vocab: int  # LM head rows on this rank
    layers: int
    gated: bool  # SwiGLU (gate + up) rather than one fc1
    rotary: bool
    dtype_bytes: int

    @classmethod
    def of(cls, model: ModelSpec, tensor_parallel_size: int = 1) -> LayerWidths:
        tp = tensor_parallel_size
        return cls(
            hidden=model.hidden_size,
            q=model.num_attention_heads // tp * model.head_size,
            kv=max(1, model.num_kv_heads // tp) * model.head_size,
            mlp=model.intermediate_size // tp,
            vocab=model.vocab_size // tp,
            layers=model.num_layers,
            gated=model.arch == "llama",
            rotary=model.arch == "llama",
            dtype_bytes=model.dtype_bytes,
        )


def gemm(name: str, count: int, rows: int, k: int, n: int, dtype_bytes: int) -> Operation:
    """`[rows, k] x [k, n]`: the weight read once, activations read and written once."""
    return Operation(
        name, "gemm", count, 2.0 * rows * k * n, float(k * n + rows * (k + n)) * dtype_bytes
    )


def elementwise(name: str, count: int, elements_moved: float, dtype_bytes: int) -> Operation:
    """A kernel that reads and writes `elements_moved` elements in all and computes little."""
    return Operation(name, "elementwise", count, 0.0, elements_moved * dtype_bytes)


def layer_operations(w: LayerWidths, num_tokens: int) -> tuple[Operation, ...]:
    """The kernels of one decoder layer on `num_tokens` rows (module docstring's table)."""
    n, h, d, L = num_tokens, w.hidden, w.dtype_bytes, w.layers
    up = 2 * w.mlp if w.gated else w.mlp
    ops = [
        elementwise("input_layernorm", L, 2.0 * n * h + h, d),
        gemm("attn_pre_proj", L, n, h, w.q + 2 * w.kv, d),
    ]
    if w.rotary:
        ops.append(elementwise("attn_rope", L, 2.0 * n * (w.q + w.kv), d))
    ops += [
        gemm("attn_post_proj", L, n, w.q, h, d),
        elementwise("add", 2 * L, 3.0 * n * h, d),
        elementwise("post_attention_layernorm", L, 2.0 * n * h + h, d),
        gemm("mlp_up_proj", L, n, h, up, d),
        elementwise("mlp_act", L, (3.0 if w.gated else 2.0) * n * w.mlp, d),
        gemm("mlp_down_proj", L, n, w.mlp, h, d),
    ]
    return tuple(ops)


def step_operations(w: LayerWidths, num_tokens: int, num_reqs: int) -> tuple[Operation, ...]:
    """Every non-attention kernel of a step: the layers' and the LM head's (one row per
    request, as vLLM computes logits only where a token is sampled)."""
    head = gemm("lm_head", 1, max(num_reqs, 1), w.hidden, w.vocab, w.dtype_bytes)
    return (*layer_operations(w, num_tokens), head)


def kernel_time(op: Operation, rates: BoundingRates, latency_s: float = 0.0) -> float:
    """Seconds of one run of `op` on a GPU of `rates` (module docstring)."""
    return latency_s + max(op.bytes / rates.memory_bytes_per_s, op.flops / rates.gemm_flops)


def is_compute_bound(op: Operation, rates: BoundingRates) -> bool:
    """Whether `op`'s arithmetic intensity is above the GPU's ridge point."""
    return op.flops > op.bytes * rates.ridge_flops_per_byte


def total_time(ops: tuple[Operation, ...], rates: BoundingRates, latency_s: float = 0.0) -> float:
    """Seconds of every run of every operation, one after another."""
    return sum(op.runs * kernel_time(op, rates, latency_s) for op in ops)


def num_kernels(ops: tuple[Operation, ...]) -> int:
    """Kernel launches of a step: every run of every operation."""
    return sum(op.runs for op in ops)
