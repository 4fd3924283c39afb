"""Model and GPU spec tables: shapes consistent with parameter counts, lookups, misses."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.errors import PagesimError, UnknownNameError
from pagesim.specs import GPUS, MODELS, GiB, GPUSpec, ModelSpec

REQUIRED_MODELS = (
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mistral-7b",
    "opt-13b",
    "opt-66b",
    "opt-175b",
    "qwen2.5-7b",
    "tiny-llama",
)
REQUIRED_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "l40s", "a10g")


def _param_count(m: ModelSpec) -> int:
    """Parameters implied by the shapes (independent of the table's num_params)."""
    h, n_layers, d, inter, vocab = (
        m.hidden_size,
        m.num_layers,
        m.head_size,
        m.intermediate_size,
        m.vocab_size,
    )
    q, kv = m.num_attention_heads * d, m.num_kv_heads * d
    if m.arch == "opt":
        # tied LM head; learned positions with 2 offset rows; biases; 2 LayerNorms per layer
        per_layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
        return vocab * h + (m.max_position_embeddings + 2) * h + n_layers * per_layer + 2 * h
    bias = q + 2 * kv if m.name.startswith("qwen") else 0
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 2 * h + bias
    return 2 * vocab * h + n_layers * per_layer + h


def test_required_names_present():
    assert set(REQUIRED_MODELS) <= set(MODELS)
    assert set(REQUIRED_GPUS) <= set(GPUS)


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_param_count_matches_shapes(name):
    m = ModelSpec.from_name(name)
    assert m.num_params == _param_count(m)
    assert m.num_attention_heads % m.num_kv_heads == 0
    assert m.weight_bytes == m.num_params * m.dtype_bytes


@pytest.mark.parametrize("name", REQUIRED_MODELS)
def test_head_size_and_keys(name):
    m = ModelSpec.from_name(name)
    assert m.name == name
    # every model in the table has head_size * heads == hidden (no explicit head_dim models)
    assert m.head_size * m.num_attention_heads == m.hidden_size


def test_published_totals():
    # totals quoted by the model cards / HF safetensors metadata
    assert MODELS["llama-2-7b"].num_params == 6_738_415_616
    assert MODELS["llama-3-8b"].num_params == 8_030_261_248
    assert MODELS["mistral-7b"].num_params == 7_241_732_096
    assert MODELS["llama-2-70b"].weight_bytes == 137_953_296_384  # 2 bytes * 68.98e9


def test_context_and_window():
    assert MODELS["llama-3.1-8b"].max_position_embeddings == 131072
    assert MODELS["llama-3.1-70b"].max_position_embeddings == 131072
    assert MODELS["llama-3-8b"].max_position_embeddings == 8192
    assert MODELS["mistral-7b"].sliding_window == 4096
    assert all(m.sliding_window is None for k, m in MODELS.items() if k != "mistral-7b")


def test_tiny_llama_shape():
    m = MODELS["tiny-llama"]
    assert (
        m.num_layers,
        m.hidden_size,
        m.num_attention_heads,
        m.num_kv_heads,
        m.head_size,
        m.vocab_size,
        m.max_position_embeddings,
    ) == (2, 128, 4, 2, 32, 512, 2048)


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_gpu_sane(name):
    g = GPUSpec.from_name(name)
    assert g.name == name
    assert 20 * GiB < g.memory_bytes < 144 * GiB
    assert 5e11 <= g.hbm_bandwidth_bytes_per_s <= 5e12
    assert 1e14 <= g.fp16_flops <= 1e15
    assert g.host_link_bytes_per_s in (32e9, 64e9)
    assert g.nvlink_bytes_per_s >= 0


def test_gpu_ordering():
    assert (
        GPUS["h200"].memory_bytes > GPUS["h100-sxm"].memory_bytes > GPUS["a100-40gb"].memory_bytes
    )
    assert GPUS["h200"].hbm_bandwidth_bytes_per_s > GPUS["h100-sxm"].hbm_bandwidth_bytes_per_s
    assert GPUS["l40s"].nvlink_bytes_per_s == 0 and GPUS["a10g"].nvlink_bytes_per_s == 0


def test_lookup_is_case_insensitive():
    assert ModelSpec.from_name("Llama-2-7B") is MODELS["llama-2-7b"]
    assert GPUSpec.from_name("H200") is GPUS["h200"]


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        ModelSpec.from_name("llama-9b")
    msg = str(e.value)
    assert "\n" not in msg and "'llama-9b'" in msg
    assert "llama-2-7b" in msg and "opt-175b" in msg
    assert isinstance(e.value, PagesimError)


def test_unknown_gpu_lists_known_names():
    with pytest.raises(UnknownNameError) as e:
        GPUSpec.from_name("v100")
    msg = str(e.value)
    assert "'v100'" in msg and "h200" in msg and "a10g" in msg and "\n" not in msg


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        MODELS["llama-2-7b"].num_layers = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        GPUS["h200"].memory_bytes = 1  # type: ignore[misc]
