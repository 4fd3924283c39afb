"""Model specs derived from Hugging Face config.json files (pagesim.hf_config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagesim.data import models_dir
from pagesim.errors import ConfigError, UnknownNameError
from pagesim.hf_config import resolve_model, shipped_models, spec_from_config
from pagesim.specs import MODELS, ModelSpec


def _config(name: str) -> dict:
    return json.loads((models_dir() / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shipped_dense_config_derives_the_table_spec(name: str) -> None:
    assert spec_from_config(_config(name), name, MODELS[name].hf_id) == MODELS[name]


# Published totals (model cards); the count is computed from the shapes alone.
PUBLISHED = {
    "mixtral-8x7b": 46.7e9,
    "qwen3-30b-a3b": 30.5e9,
    "deepseek-v2-lite": 15.7e9,
    "gemma-2-9b": 9.24e9,
    "gpt-oss-20b": 20.9e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_new_family_param_count_matches_model_card(name: str) -> None:
    spec = ModelSpec.from_name(name)
    assert abs(spec.num_params - PUBLISHED[name]) / PUBLISHED[name] < 0.003


def test_new_family_shapes() -> None:
    mixtral = ModelSpec.from_name("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size) == (
        8,
        2,
        14336,
    )
    assert not mixtral.is_hybrid and mixtral.sliding_window is None
    qwen = ModelSpec.from_name("qwen3-30b-a3b")
    assert (qwen.num_experts, qwen.num_experts_per_tok, qwen.head_size, qwen.num_kv_heads) == (
        128,
        8,
        128,
        4,
    )
    ds = ModelSpec.from_name("deepseek-v2-lite")
    assert ds.use_mla and (ds.kv_lora_rank, ds.qk_rope_head_dim) == (512, 64)
    assert (ds.num_experts, ds.num_shared_experts, ds.num_dense_layers) == (64, 2, 1)
    gemma = ModelSpec.from_name("gemma-2-9b")
    assert gemma.is_hybrid and gemma.sliding_window == 4096
    assert gemma.attention_kinds[:3] == ("sliding", "full", "sliding")
    oss = ModelSpec.from_name("gpt-oss-20b")
    assert oss.is_hybrid and oss.sliding_window == 128 and oss.attention_kinds.count("full") == 12
    # MXFP4 experts: the published checkpoint is 12.8 GiB
    assert abs(oss.weight_bytes / 1024**3 - 12.8) < 0.1
    assert ModelSpec.from_name("mistral-7b").attention_kinds == ("sliding",) * 32


def test_hf_ids_resolve_to_shipped_names() -> None:
    assert ModelSpec.from_name("meta-llama/Llama-2-7b-hf") is MODELS["llama-2-7b"]
    assert ModelSpec.from_name("Qwen/Qwen3-30B-A3B").name == "qwen3-30b-a3b"
    ids = {hf for hf in shipped_models().values() if hf}
    assert "google/gemma-2-9b" in ids and "openai/gpt-oss-20b" in ids


def test_path_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_config("mixtral-8x7b")))
    by_folder = resolve_model(str(folder))
    by_file = resolve_model(str(folder / "config.json"))
    assert by_folder == by_file and by_folder.name == "my-model"
    assert by_folder.num_params == ModelSpec.from_name("mixtral-8x7b").num_params


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["MambaForCausalLM"]}, "architecture MambaForCausalLM is not modelled"),
        ({"hidden_size": 64}, "missing 'architectures'"),
        (
            {"architectures": ["LlamaForCausalLM"], "hidden_size": 64},
            "missing 'num_attention_heads'",
        ),
        (
            {**_config("llama-2-7b"), "num_key_value_heads": 5},
            "not a multiple of num_key_value_heads=5",
        ),
        ({**_config("llama-2-7b"), "num_hidden_layers": "32"}, "num_hidden_layers='32'"),
        ({**_config("gpt-oss-20b"), "layer_types": ["chunked_attention"] * 24}, "not modelled"),
        ({**_config("llama-2-7b"), "quantization_config": {"quant_method": "awq"}}, "quantization"),
    ],
)
def test_bad_or_partial_config_is_one_line(config: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        spec_from_config(config, "bad")
    assert "\n" not in str(err.value)


def test_unreadable_or_missing(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        resolve_model(str(tmp_path))
    with pytest.raises(ConfigError, match="holds no config.json"):
        resolve_model(str(tmp_path / ".."))
    with pytest.raises(UnknownNameError, match="config.json"):
        resolve_model("no-such-model")
