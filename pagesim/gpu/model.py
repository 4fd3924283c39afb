"""A random-weight decoder of any `ModelSpec` (Llama family; OPT too), for timing only.

The weights are drawn on the device from a seed (nothing is downloaded), so a step costs what
the real model's step costs (same shapes, same kernels, same bytes moved) while its tokens mean
nothing: the runner emits `synthetic_token(...)` as the sampled tokens, as the simulator does,
but the LM head and the sampler still run so that their cost is real.

One step, all sequences flattened into `T = num_tokens` rows (vLLM's layout):

    input_ids [T] -> embed -> h [T, hidden]
    per layer (llama):  x = RMSNorm(h + residual)
                        q, k, v = split(x @ W_qkv^T)        [T, H, D], [T, KV, D], [T, KV, D]
                        q, k = RoPE(q, k, positions)        (NeoX halves, as HF Llama)
                        a = attention(q, k, v)              paged backend: writes K/V, attends
                        h = a @ W_o^T ; x = RMSNorm(h + residual)
                        h = (silu(x @ W_gate^T) * (x @ W_up^T)) @ W_down^T
                        (MoE layers: top-k of softmax(x @ W_router^T), then the chosen
                        experts' MLPs through the grouped-GEMM kernel, `kernels.fused_moe`)
    final RMSNorm -> rows at logits_indices [S] -> LM head [S, vocab] -> sampler -> [S] ids

OPT: LayerNorm with bias, learned positions (offset 2), biases on every projection, ReLU MLP,
tied LM head. A layer's attention kind is the spec's (`ModelSpec.attention_kinds`: sliding
layers attend to their last `sliding_window` positions). `metadata` is one `AttentionMetadata`
when every layer reads one block table, or one per KV cache group under the hybrid layout
(`pagesim.gpu.kv_layout`), each layer reading its group's. `skip_attention=True` replaces attention
by the identity (the K/V cache is neither written nor read): calibration times the rest of the step
that way, and the memory profile run uses it as vLLM's profile run does (no attention metadata).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagesim.gpu.attention import AttentionMetadata, PagedAttentionBackend
from pagesim.gpu.kernels.fused_moe import fused_moe, fused_moe_reference, route
from pagesim.gpu.kv_layout import KVLayout
from pagesim.specs import ModelSpec

#: Standard deviation of every random weight matrix (GPT-2/Llama initializer range): keeps
#: activations finite through any depth once the norms rescale them.
INIT_STD = 0.02
#: RoPE base. Llama 2 uses 10,000 and Llama 3 500,000; the value changes no cost, so one base.
ROPE_THETA = 10_000.0
RMS_EPS = 1e-5
OPT_POSITION_OFFSET = 2  # OPT's learned position table has two extra leading rows

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: key, value caches
#: One step's attention inputs: one table for every layer, or one per KV cache group.
StepMetadata = AttentionMetadata | tuple[AttentionMetadata, ...]


@dataclass(frozen=True)
class DecoderConfig:
    """What a random-weight decoder is built from, as one value: a variant of the decoder (the
    tensor-parallel shard) takes the same and adds only its own arguments."""

    spec: ModelSpec
    dtype: torch.dtype
    device: torch.device | str
    block_size: int  # the attention backend's, until `set_block_size`
    seed: int = 0  # the same seed draws the same weights


class RandomWeightDecoder:
    """Weights of `spec` drawn from `seed` on `device`, and a functional forward pass.

    Not an `nn.Module`: plain tensors keep Python overhead per layer low (eager decode steps
    are launch-bound), and nothing here trains. `attn` is swapped by `set_block_size`.
    """

    def __init__(self, config: DecoderConfig) -> None:
        spec, dtype, seed = config.spec, config.dtype, config.seed
        self.spec = spec
        self.dtype = dtype
        self.device = torch.device(config.device)
        self.seed = seed
        self.head_size = spec.head_size
        self.num_heads, self.num_kv_heads = self._attention_heads()
        self.q_size = self.num_heads * self.head_size
        self.kv_size = self.num_kv_heads * self.head_size
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.layers = [self._make_layer(gen, i) for i in range(spec.num_layers)]
        hidden = spec.hidden_size
        self.embed = self._rand((spec.vocab_size, hidden), gen)
        if spec.arch == "opt":
            self.pos_embed = self._rand(
                (spec.max_position_embeddings + OPT_POSITION_OFFSET, hidden), gen
            )
            self.final_norm = (self._ones(hidden), self._zeros(hidden))
            self.lm_head = self.embed  # tied
        else:
            self.final_norm = (self._ones(hidden), None)
            self.lm_head = self._rand((spec.vocab_size, hidden), gen)
            self.cos, self.sin = _rope_tables(
                spec.max_position_embeddings, self.head_size, dtype, self.device
            )
        # Per layer its window (None: full attention); under the hybrid layout, its group.
        self.layer_windows = tuple(self._window(kind) for kind in spec.attention_kinds)
        self.hybrid_layout = KVLayout.of(spec, hybrid_kv_cache_manager=True)
        self.set_block_size(config.block_size)
        self.sample_gen = torch.Generator(device=self.device).manual_seed(seed + 1)

    def _attention_heads(self) -> tuple[int, int]:
        """(query heads, KV heads) this decoder computes and caches: all of the spec's."""
        return self.spec.num_attention_heads, self.spec.num_kv_heads

    # ---- weights ------------------------------------------------------------------------------
    def _rand(self, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
        w = torch.empty(shape, dtype=self.dtype, device=self.device)
        return w.normal_(0.0, INIT_STD, generator=gen)

    def _ones(self, n: int) -> torch.Tensor:
        return torch.ones(n, dtype=self.dtype, device=self.device)

    def _zeros(self, n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=self.dtype, device=self.device)

    def _make_layer(self, gen: torch.Generator, index: int) -> dict[str, torch.Tensor]:
        """Layer `index`'s tensors from `layer_shapes`: matrices (and expert stacks) random,
        norm scales one, biases zero."""
        layer: dict[str, torch.Tensor] = {}
        for name, shape in layer_shapes(self.spec, index).items():
            if len(shape) >= 2:
                layer[name] = self._rand(shape, gen)
            elif name.startswith("norm") and not name.endswith("_b"):
                layer[name] = self._ones(shape[0])
            else:
                layer[name] = self._zeros(shape[0])
        return layer

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weight tensors (tied tensors counted once)."""
        tensors = [self.embed, self.lm_head, *[t for t in self.final_norm if t is not None]]
        if self.spec.arch == "opt":
            tensors.append(self.pos_embed)
        for layer in self.layers:
            tensors.extend(t for t in layer.values() if t is not None)
        seen = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
        return sum(seen.values())

    def set_block_size(self, block_size: int) -> None:
        """Use backends for another KV block size (the caches must be rebuilt to match).

        One backend per window the layers use; `attn` is the one-table layout's (its group
        slides only when every layer does), `group_attn(kind)` a KV cache group's."""
        one_table = KVLayout.of(self.spec, hybrid_kv_cache_manager=False).group_kinds[0]
        kinds = (one_table, *self.hybrid_layout.group_kinds)
        windows = (*self.layer_windows, *(self._window(k) for k in kinds))
        self._backends = {
            w: PagedAttentionBackend(
                self.num_heads, self.num_kv_heads, self.head_size, block_size, sliding_window=w
            )
            for w in dict.fromkeys(windows)
        }
        self.attn = self.group_attn(one_table)

    def group_attn(self, kind: str) -> PagedAttentionBackend:
        """The backend whose `build_metadata` plans a KV cache group of attention `kind`."""
        return self._backends[self._window(kind)]

    def _window(self, kind: str) -> int | None:
        return self.spec.sliding_window if kind == "sliding" else None

    # ---- forward ------------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: StepMetadata | None,
        kv_caches: KVCache | None,
        logits_indices: torch.Tensor,
        skip_attention: bool = False,
    ) -> torch.Tensor:
        """Hidden states of the rows at `logits_indices`, `[S, hidden]` after the final norm.

        input_ids, positions: int64 `[T]`. `metadata`/`kv_caches` may be None only with
        `skip_attention`.
        """
        if self.spec.arch == "opt":
            return self._forward_opt(
                input_ids, positions, metadata, kv_caches, logits_indices, skip_attention
            )
        hidden = self.spec.hidden_size
        h = self._embed(input_ids)
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, D/2]
        sin = self.sin[positions].unsqueeze(1)
        residual: torch.Tensor | None = None
        for i, layer in enumerate(self.layers):
            residual = h if residual is None else residual + h
            x = F.rms_norm(residual, (hidden,), layer["norm1"], RMS_EPS)
            a = self._attention(
                i, F.linear(x, layer["qkv"]), cos, sin, metadata, kv_caches, skip_attention
            )
            residual = residual + self._row_linear(a, layer["o"])
            x = F.rms_norm(residual, (hidden,), layer["norm2"], RMS_EPS)
            h = self._mlp(layer, x)
        residual = residual + h if residual is not None else h
        x = residual[logits_indices]  # norm only the rows that reach the LM head
        return F.rms_norm(x, (hidden,), self.final_norm[0], RMS_EPS)

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`[T, hidden]` token embeddings (a tensor-parallel model gathers its vocab shards)."""
        return F.embedding(input_ids, self.embed)

    def _mlp(self, layer: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """A Llama layer's MLP: SwiGLU, or for a MoE layer its routed experts (plus shared
        experts, a SwiGLU of their summed width, where the spec has them)."""
        out = None
        if "router" in layer:
            weights, ids = route(F.linear(x, layer["router"]), self.spec.num_experts_per_tok)
            out = fused_moe(x, layer["w13"], layer["w2"], weights, ids)
            if "gate_up" not in layer:
                return out
        gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
        dense = self._row_linear(F.silu(gate) * up, layer["down"])
        return dense if out is None else out + dense

    def _row_linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The o and down projections (row-parallel, all-reduced, under tensor parallelism)."""
        return F.linear(x, weight)

    def _attention(
        self,
        i: int,
        qkv: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        metadata: StepMetadata | None,
        kv_caches: KVCache | None,
        skip: bool,
    ) -> torch.Tensor:
        """`[T, q_size]` attention output of layer `i` from its fused `[T, qkv]` projection."""
        t = qkv.shape[0]
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_size
        v = qkv[:, self.q_size + self.kv_size :].view(t, kv, d)
        if cos is not None:  # one rotation of the q and k heads together: half the launches
            qk = _rope(qkv[:, : self.q_size + self.kv_size].view(t, h + kv, d), cos, sin)
            q, k = qk[:, :h], qk[:, h:]
        else:
            q = qkv[:, : self.q_size].view(t, h, d)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, kv, d)
        if skip:
            return q.reshape(t, self.q_size)
        key_cache, value_cache = kv_caches[i]
        md = (
            metadata[self.hybrid_layout.layer_group[i]] if isinstance(metadata, tuple) else metadata
        )
        out = self._backends[self.layer_windows[i]].forward(q, k, v, key_cache, value_cache, md)
        return out.view(t, self.q_size)

    def _forward_opt(self, input_ids, positions, metadata, kv_caches, logits_indices, skip):
        hidden = self.spec.hidden_size
        h = F.embedding(input_ids, self.embed) + F.embedding(
            positions + OPT_POSITION_OFFSET, self.pos_embed
        )
        for i, layer in enumerate(self.layers):
            x = F.layer_norm(h, (hidden,), layer["norm1"], layer["norm1_b"])
            a = self._attention(
                i, F.linear(x, layer["qkv"], layer["qkv_b"]), None, None, metadata, kv_caches, skip
            )
            h = h + F.linear(a, layer["o"], layer["o_b"])
            x = F.layer_norm(h, (hidden,), layer["norm2"], layer["norm2_b"])
            x = F.relu(F.linear(x, layer["fc1"], layer["fc1_b"]))
            h = h + F.linear(x, layer["fc2"], layer["fc2_b"])
        x = h[logits_indices]
        return F.layer_norm(x, (hidden,), self.final_norm[0], self.final_norm[1])

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[S, vocab]` fp32 logits (vLLM's sampler works in fp32)."""
        return F.linear(hidden, self.lm_head).float()

    def sample(self, logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Token ids `[S]` (int64, on the device): greedy at temperature 0, else random.

        Random sampling as vLLM's torch path does it without top-k/top-p: softmax of
        logits / T, then argmax of probs / q with q ~ Exp(1) (the exponential race), which
        draws from the softmax without a cumulative sum.
        """
        if temperature == 0.0:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / temperature, dim=-1)
        q = torch.empty_like(probs).exponential_(generator=self.sample_gen)
        return probs.div_(q).argmax(dim=-1)


def is_moe_layer(spec: ModelSpec, index: int) -> bool:
    """Layer `index` routes to experts (a MoE model's leading `num_dense_layers` do not)."""
    return spec.is_moe and index >= spec.num_dense_layers


def layer_shapes(spec: ModelSpec, index: int = 0) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of decoder layer `index`, `[out, in]` for matrices (the fused q/k/v rows;
    Llama's fused gate/up rows; a MoE layer's router `[E, hidden]` and expert stacks
    `w13 [E, 2 I, hidden]`, `w2 [E, hidden, I]` as the fused-MoE kernel reads them)."""
    hidden, inter = spec.hidden_size, spec.intermediate_size
    q = spec.num_attention_heads * spec.head_size
    qkv = q + 2 * spec.num_kv_heads * spec.head_size
    shapes: dict[str, tuple[int, ...]] = {
        "qkv": (qkv, hidden),
        "o": (hidden, q),
        "norm1": (hidden,),
        "norm2": (hidden,),
    }
    if spec.arch == "opt":
        shapes.update(
            fc1=(inter, hidden),
            fc2=(hidden, inter),
            qkv_b=(qkv,),
            o_b=(hidden,),
            fc1_b=(inter,),
            fc2_b=(hidden,),
            norm1_b=(hidden,),
            norm2_b=(hidden,),
        )
    elif is_moe_layer(spec, index):
        e, moe = spec.num_experts, spec.moe_intermediate_size
        shapes.update(router=(e, hidden), w13=(e, 2 * moe, hidden), w2=(e, hidden, moe))
        if spec.num_shared_experts:
            shared = spec.num_shared_experts * moe
            shapes.update(gate_up=(2 * shared, hidden), down=(hidden, shared))
    else:
        shapes.update(gate_up=(2 * inter, hidden), down=(hidden, inter))
    return shapes


def _rope_tables(
    max_pos: int, head_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin `[max_pos, head_size / 2]` of the rotary angles pos * theta^(-2i / D)."""
    half = head_size // 2
    inv_freq = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) * 2.0 / head_size)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation of `[T, heads, D]` by the `[T, 1, D/2]` tables (a new tensor)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reference_attention_forward(
    model: RandomWeightDecoder,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    seq_ranges: list[tuple[int, int, int]],
    past_kv: list[dict[int, tuple[torch.Tensor, torch.Tensor]]],
    logits_indices: torch.Tensor,
) -> torch.Tensor:
    """The same forward with attention done densely in fp32 over explicit per-sequence K/V.

    For tests: `seq_ranges[s] = (row_start, row_end, seq_key)` are sequence s's query rows;
    `past_kv[layer][seq_key]` holds its earlier K and V `[n, KV, D]` and is extended in place,
    so calling this step after step mirrors a paged run. Llama and OPT; sliding layers see
    their window, MoE layers run every expert on every token (`fused_moe_reference`).
    """
    spec = model.spec
    hidden = spec.hidden_size

    def split_qkv(qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t = qkv.shape[0]
        q = qkv[:, : model.q_size].view(t, model.num_heads, model.head_size)
        k = qkv[:, model.q_size : model.q_size + model.kv_size].view(
            t, model.num_kv_heads, model.head_size
        )
        v = qkv[:, model.q_size + model.kv_size :].view(t, model.num_kv_heads, model.head_size)
        return q, k, v

    if spec.arch == "opt":
        h = F.embedding(input_ids, model.embed) + F.embedding(
            positions + OPT_POSITION_OFFSET, model.pos_embed
        )
        for i, layer in enumerate(model.layers):
            x = F.layer_norm(h, (hidden,), layer["norm1"], layer["norm1_b"])
            q, k, v = split_qkv(F.linear(x, layer["qkv"], layer["qkv_b"]))
            out = _dense_attention(model, q, k, v, seq_ranges, past_kv[i], model.layer_windows[i])
            h = h + F.linear(out.view(-1, model.q_size), layer["o"], layer["o_b"])
            x = F.layer_norm(h, (hidden,), layer["norm2"], layer["norm2_b"])
            h = h + F.linear(
                F.relu(F.linear(x, layer["fc1"], layer["fc1_b"])), layer["fc2"], layer["fc2_b"]
            )
        return F.layer_norm(h[logits_indices], (hidden,), model.final_norm[0], model.final_norm[1])
    h = F.embedding(input_ids, model.embed)
    cos = model.cos[positions].unsqueeze(1)
    sin = model.sin[positions].unsqueeze(1)
    residual = None
    for i, layer in enumerate(model.layers):
        residual = h if residual is None else residual + h
        x = F.rms_norm(residual, (hidden,), layer["norm1"], RMS_EPS)
        q, k, v = split_qkv(F.linear(x, layer["qkv"]))
        out = _dense_attention(
            model,
            _rope(q, cos, sin),
            _rope(k, cos, sin),
            v,
            seq_ranges,
            past_kv[i],
            model.layer_windows[i],
        )
        residual = residual + F.linear(out.view(-1, model.q_size), layer["o"])
        x = F.rms_norm(residual, (hidden,), layer["norm2"], RMS_EPS)
        h = _reference_mlp(model, layer, x)
    residual = residual + h
    return F.rms_norm(residual[logits_indices], (hidden,), model.final_norm[0], RMS_EPS)


def _reference_mlp(
    model: RandomWeightDecoder, layer: dict[str, torch.Tensor], x: torch.Tensor
) -> torch.Tensor:
    """A Llama layer's MLP with every expert of a MoE layer run on every token (fp32)."""
    out = None
    if "router" in layer:
        weights, ids = route(F.linear(x, layer["router"]), model.spec.num_experts_per_tok)
        out = fused_moe_reference(x, layer["w13"], layer["w2"], weights, ids).to(x.dtype)
        if "gate_up" not in layer:
            return out
    gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
    dense = F.linear(F.silu(gate) * up, layer["down"])
    return dense if out is None else out + dense


def _dense_attention(
    model: RandomWeightDecoder,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_ranges: list[tuple[int, int, int]],
    past: dict[int, tuple[torch.Tensor, torch.Tensor]],
    window: int | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's rows over its past and new K/V, in fp32 (`past`
    is one layer's and is extended in place); with `window`, each row sees its last `window`
    positions."""
    group = model.num_heads // model.num_kv_heads
    out = torch.zeros_like(q)
    for r0, r1, key in seq_ranges:
        pk, pv = past.get(key, (k[:0], v[:0]))
        kk, vv = torch.cat([pk, k[r0:r1]]), torch.cat([pv, v[r0:r1]])
        past[key] = (kk, vv)
        n, m = kk.shape[0], r1 - r0
        logits = (
            torch.einsum("qhd,khd->hqk", q[r0:r1].float(), kk.float().repeat_interleave(group, 1))
            * model.attn.scale
        )
        ar = torch.arange(n, device=q.device)
        mask = ar[None, :] <= ar[n - m :, None]
        if window is not None:
            mask &= ar[n - m :, None] - ar[None, :] < window
        probs = logits.masked_fill(~mask, float("-inf")).softmax(-1)
        out[r0:r1] = torch.einsum("hqk,khd->qhd", probs, vv.float().repeat_interleave(group, 1)).to(
            out.dtype
        )
    return out
