"""The random-weight decoder: shapes that reproduce the published parameter counts, seeded
weights, and a paged forward equal to a dense fp32 forward (CPU: Triton interpreter)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pagesim.gpu.kv_layout import KVLayout
from pagesim.gpu.model import (
    OPT_POSITION_OFFSET,
    DecoderConfig,
    RandomWeightDecoder,
    layer_shapes,
    reference_attention_forward,
)
from pagesim.gpu.runner import allocate_kv_cache
from pagesim.kvcache.sizing import page_size_bytes
from pagesim.specs import MODELS, ModelSpec

TINY = ModelSpec.from_name("tiny-llama")


def num_weights(spec: ModelSpec) -> int:
    """Parameters the random-weight model holds for `spec` (tied tensors once): embeddings,
    layers, final norm, LM head (Llama, untied) or learned positions (OPT, tied head)."""
    hidden = spec.hidden_size
    layers = sum(
        math.prod(s) for i in range(spec.num_layers) for s in layer_shapes(spec, i).values()
    )
    total = spec.vocab_size * hidden + layers
    if spec.arch == "opt":
        return total + (spec.max_position_embeddings + OPT_POSITION_OFFSET) * hidden + 2 * hidden
    return total + hidden + spec.vocab_size * hidden


@pytest.mark.parametrize("name", sorted(MODELS))
def test_weight_shapes_give_the_published_parameter_count(name: str) -> None:
    spec = MODELS[name]
    if name == "qwen2.5-7b":
        # Qwen2 adds q/k/v biases, which the Llama-shaped model leaves out (no cost effect).
        biases = spec.num_layers * (spec.hidden_size + 2 * spec.num_kv_heads * spec.head_size)
        assert num_weights(spec) + biases == spec.num_params
    else:
        assert num_weights(spec) == spec.num_params


def test_tiny_model_holds_exactly_its_weights_and_is_seeded(device: str) -> None:
    a = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, 16, seed=1))
    b = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, 16, seed=1))
    c = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, 16, seed=2))
    assert a.weight_bytes == TINY.num_params * 4
    assert torch.equal(a.layers[1]["qkv"], b.layers[1]["qkv"])
    assert not torch.equal(a.layers[1]["qkv"], c.layers[1]["qkv"])
    assert float(a.lm_head.std()) == pytest.approx(0.02, rel=0.05)


def _paged_vs_dense(model: RandomWeightDecoder, device: str) -> None:
    """Step 1: a prompt of 37 and a prompt of 20; step 2: a decode of the first and a second
    chunk of 9 tokens of the other (over its 20 cached ones), all through one KV cache."""
    kv = allocate_kv_cache(model, 32, device)
    rows = [[5, 9, 2, 30, 17], [11, 3, 8, 21]]
    past = [{} for _ in model.layers]
    gen = torch.Generator().manual_seed(0)
    for computed, new in (([0, 0], [37, 20]), ([37, 20], [1, 9])):
        md = model.attn.build_metadata(rows, computed, new, device)
        ids = torch.randint(0, model.spec.vocab_size, (sum(new),), generator=gen).to(device)
        pos = torch.cat(
            [torch.arange(c, c + n, device=device) for c, n in zip(computed, new, strict=False)]
        )
        li = (md.query_start_loc[1:] - 1).long()
        out = model.forward(ids, pos, md, kv, li)
        ranges = [(0, new[0], 0), (new[0], new[0] + new[1], 1)]
        ref = reference_attention_forward(model, ids, pos, ranges, past, li)
        err = float((out - ref).norm() / ref.norm())
        assert err < 1e-5, f"paged forward differs from dense (rel {err:.2e})"


@pytest.mark.parametrize("block_size", [8, 16])
def test_paged_forward_equals_dense_forward(block_size: int, device: str) -> None:
    model = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, block_size, seed=0))
    _paged_vs_dense(model, device)


def test_paged_opt_forward_equals_dense_opt_forward(device: str) -> None:
    opt = dataclasses.replace(TINY, name="tiny-opt", arch="opt", intermediate_size=512)
    _paged_vs_dense(
        RandomWeightDecoder(DecoderConfig(opt, torch.float32, device, 16, seed=0)), device
    )


def test_skip_attention_leaves_the_cache_alone(device: str) -> None:
    model = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, 16, seed=0))
    kv = allocate_kv_cache(model, 8, device)
    md = model.attn.build_metadata([[1, 2]], [0], [20], device)
    h = model.forward(
        *(torch.arange(20, device=device),) * 2,
        md,
        kv,
        torch.tensor([19], device=device),
        skip_attention=True,
    )
    assert h.shape == (1, TINY.hidden_size) and torch.isfinite(h).all()
    assert all(not k.any() and not v.any() for k, v in kv)


def test_opt_variant_runs_with_tied_head(device: str) -> None:
    opt = dataclasses.replace(TINY, name="tiny-opt", arch="opt", intermediate_size=512)
    model = RandomWeightDecoder(DecoderConfig(opt, torch.float32, device, 16, seed=0))
    assert model.lm_head is model.embed
    kv = allocate_kv_cache(model, 8, device)
    md = model.attn.build_metadata([[1, 2]], [0], [18], device)
    t = torch.arange(18, device=device)
    h = model.forward(t, t, md, kv, torch.tensor([17], device=device))
    assert h.shape == (1, opt.hidden_size) and torch.isfinite(h).all()
    assert kv[0][0][1].abs().sum() > 0  # its K/V were cached


def test_sampler_greedy_and_random(device: str) -> None:
    model = RandomWeightDecoder(DecoderConfig(TINY, torch.float32, device, 16, seed=0))
    logits = torch.full((3, TINY.vocab_size), -30.0, device=device)
    logits[0, 7] = logits[1, 99] = logits[2, 5] = 10.0
    assert model.sample(logits, temperature=0.0).tolist() == [7, 99, 5]
    assert model.sample(logits, temperature=1.0).tolist() == [7, 99, 5]  # a peaked softmax
    flat = torch.zeros((2000, TINY.vocab_size), device=device)
    draws = model.sample(flat, temperature=1.0)
    assert len(set(draws.tolist())) > 400  # uniform logits spread over the vocabulary


TINY_MOE = ModelSpec.from_name("tiny-moe")
TINY_HYBRID = ModelSpec.from_name("tiny-hybrid")


@pytest.mark.parametrize("block_size", [8, 16])
def test_paged_moe_forward_equals_dense_forward(block_size: int, device: str) -> None:
    """Routed experts through the grouped GEMM = every expert densely, prefill and decode."""
    model = RandomWeightDecoder(DecoderConfig(TINY_MOE, torch.float32, device, block_size, seed=0))
    assert set(model.layers[0]) >= {"router", "w13", "w2"} and "gate_up" not in model.layers[0]
    assert model.weight_bytes == num_weights(TINY_MOE) * 4
    _paged_vs_dense(model, device)


def test_moe_forward_of_one_token(device: str) -> None:
    model = RandomWeightDecoder(DecoderConfig(TINY_MOE, torch.float32, device, 16, seed=3))
    kv = allocate_kv_cache(model, 4, device)
    md = model.attn.build_metadata([[2]], [0], [1], device)
    ids, pos, li = (torch.tensor([v], device=device) for v in (7, 0, 0))
    out = model.forward(ids, pos, md, kv, li)
    ref = reference_attention_forward(model, ids, pos, [(0, 1, 0)], [{} for _ in kv], li)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


def test_hybrid_layout_shares_one_tensor_per_layer_index_of_the_groups(device: str) -> None:
    layout = KVLayout.of(TINY_HYBRID, hybrid_kv_cache_manager=True)
    assert layout.group_kinds == ("sliding", "full")
    assert layout.layer_group == (0, 1, 0, 1) and layout.layer_tensor == (0, 0, 1, 1)
    model = RandomWeightDecoder(DecoderConfig(TINY_HYBRID, torch.float32, device, 8, seed=0))
    kv = allocate_kv_cache(model, 5, device, layout=layout)
    ptr = [k.data_ptr() for k, _ in kv]
    assert ptr[0] == ptr[1] and ptr[2] == ptr[3] and ptr[0] != ptr[2]
    # one block of the pool holds one group's layers: sizing's hybrid page size
    page = page_size_bytes(TINY_HYBRID, 8, hybrid_kv_cache_manager=True) * 2  # fp32 here
    assert sum(k.nbytes + v.nbytes for k, v in kv[:1] + kv[2:3]) == 5 * page
    one_table = KVLayout.of(TINY_HYBRID, hybrid_kv_cache_manager=False)
    assert one_table.group_kinds == ("full",) and one_table.layer_tensor == (0, 1, 2, 3)


def test_paged_hybrid_forward_equals_dense_forward(device: str) -> None:
    """Sliding layers (window 40) read group 0's table, whose blocks before the window are the
    null block (the hybrid manager frees them), full layers group 1's; the paged forward
    equals a dense forward that masks each sliding layer to its window."""
    bs = 8
    model = RandomWeightDecoder(DecoderConfig(TINY_HYBRID, torch.float32, device, bs, seed=0))
    layout = KVLayout.of(TINY_HYBRID, hybrid_kv_cache_manager=True)
    kv = allocate_kv_cache(model, 40, device, layout=layout)
    sliding = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]]  # group 0
    full = [[20, 21, 22, 23, 24, 25, 26, 27], [30, 31, 32, 33, 34, 35]]  # group 1
    past = [{} for _ in model.layers]
    gen = torch.Generator().manual_seed(0)
    for computed, new in (([0, 0], [50, 20]), ([50, 20], [1, 25]), ([51, 45], [1, 1])):
        seq_lens = [c + n for c, n in zip(computed, new, strict=True)]
        for row, start in zip(sliding, [c - 39 for c in computed], strict=True):
            row[: max(0, start) // bs] = [0] * (max(0, start) // bs)  # out of the window
        md = tuple(
            model.group_attn(kind).build_metadata(
                [r[: -(-n // bs)] for r, n in zip(rows, seq_lens, strict=True)],
                computed,
                new,
                device,
            )
            for kind, rows in zip(layout.group_kinds, (sliding, full), strict=True)
        )
        assert md[0].is_decode_only == md[1].is_decode_only
        ids = torch.randint(0, TINY_HYBRID.vocab_size, (sum(new),), generator=gen).to(device)
        pos = torch.cat(
            [torch.arange(c, c + n, device=device) for c, n in zip(computed, new, strict=True)]
        )
        li = (md[0].query_start_loc[1:] - 1).long()
        out = model.forward(ids, pos, md, kv, li)
        ranges = [(0, new[0], 0), (new[0], new[0] + new[1], 1)]
        ref = reference_attention_forward(model, ids, pos, ranges, past, li)
        err = float((out - ref).norm() / ref.norm())
        assert err < 1e-5, f"paged hybrid forward differs from dense (rel {err:.2e})"
        assert max(seq_lens) <= 8 * bs
    assert sliding[0][:1] == [0]  # the window did free blocks along the way
