"""Model specs from Hugging Face `config.json` files, as `vllm serve --model` takes a model.

`resolve_model(source)` accepts a shipped model's name (`mixtral-8x7b`), a Hugging Face id that
a shipped config stands for (`meta-llama/Llama-2-7b-hf`), a path to a `config.json`, or a
folder holding one. The shipped configs (`pagesim/data/models/<name>.json`, sources in the
README there) carry only the keys that shape serving; no weights.

`spec_from_config` derives a `ModelSpec`: layers, heads, KV heads, head size, intermediate
size, vocabulary, max positions, the per-layer attention pattern (sliding window), MoE experts
and top-k, MLA ranks, and the parameter count computed from the weight shapes of the
architecture's modelling code (embeddings and an untied LM head included). An architecture
pagesim does not model, or a config that lacks a key the architecture needs, raises
`ConfigError` with one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pagesim.data import models_dir
from pagesim.errors import ConfigError, unknown_name
from pagesim.specs import MODELS, ModelSpec

# architectures[0] -> family. "llama": pre-norm decoder with a gated MLP (Llama, Mistral,
# Qwen2/3, Mixtral, Qwen3-MoE, Gemma 2, GPT-OSS); "deepseek": MLA + DeepSeekMoE; "opt".
ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "llama",
    "Gemma2ForCausalLM": "llama",
    "GptOssForCausalLM": "llama",
    "DeepseekV2ForCausalLM": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek",
    "OPTForCausalLM": "opt",
}
# Bytes per weight of an MXFP4 tensor: 4-bit values plus one 8-bit scale per 32 values.
MXFP4_BYTES_PER_PARAM = (4 * 32 + 8) / 32 / 8
_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "half": 2, "float32": 2}  # fp32 is served in 16 bit
_LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}


def shipped_models() -> dict[str, str]:
    """Shipped config name -> the Hugging Face id it stands for ("" for none)."""
    names = {p.stem: "" for p in sorted(models_dir().glob("*.json"))}
    for spec in MODELS.values():
        if spec.name in names:
            names[spec.name] = spec.hf_id
    names.update({n: hf for n, hf in NEW_FAMILY_IDS.items() if n in names})
    return names


# Hugging Face ids of the shipped configs that have no entry in `specs.MODELS`.
NEW_FAMILY_IDS: dict[str, str] = {
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "deepseek-v2-lite": "deepseek-ai/DeepSeek-V2-Lite",
    "gemma-2-9b": "google/gemma-2-9b",
    "gpt-oss-20b": "openai/gpt-oss-20b",
}


def resolve_model(source: str) -> ModelSpec:
    """The spec of a shipped name, a known Hugging Face id, or a config.json path/folder."""
    shipped = shipped_models()
    key = source.lower()
    by_id = {hf.lower(): name for name, hf in shipped.items() if hf}
    name = key if key in shipped else by_id.get(key)
    if name is not None:
        if name in MODELS:
            return MODELS[name]
        path = models_dir() / f"{name}.json"
        return spec_from_config(_read(path), name, shipped[name])
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"model folder {source!r} holds no config.json")
        return spec_from_config(_read(path), path.parent.name)
    if path.is_file():
        return spec_from_config(
            _read(path), path.parent.name if path.name == "config.json" else path.stem
        )
    known = sorted(shipped) + ["<a config.json or a folder holding one>"]
    raise unknown_name("model", source, known)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read model config {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model config {path}: expected a JSON object")
    return data


class _Config:
    """Typed reads of one config.json, each failure one line naming the key."""

    def __init__(self, data: dict[str, Any], name: str) -> None:
        self.data, self.name = data, name

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def int(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise ConfigError(f"model config {self.name!r}: missing {key!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"model config {self.name!r}: {key}={value!r} must be an int >= {minimum}"
            )
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"model config {self.name!r}: {key}={value!r} must be true/false")
        return value


def spec_from_config(data: dict[str, Any], name: str, hf_id: str = "") -> ModelSpec:
    """Derive the `ModelSpec` of one Hugging Face config (see the module docstring)."""
    archs = data.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError(f"model config {name!r}: missing 'architectures'")
    arch = archs[0]
    family = ARCHITECTURES.get(arch)
    if family is None:
        raise ConfigError(
            f"model config {name!r}: architecture {arch} is not modelled by pagesim; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    cfg = _Config(data, name)
    dtype = data.get("torch_dtype", data.get("dtype", "bfloat16"))
    if dtype not in _DTYPE_BYTES:
        raise ConfigError(f"model config {name!r}: torch_dtype={dtype!r} is not modelled")
    if family == "opt":
        return _opt_spec(cfg, hf_id)
    common = _attention_shape(cfg, arch)
    layer_types, window = _layer_pattern(cfg, arch, common["num_layers"])
    moe = _moe_shape(cfg, arch, family)
    params, expert_params = _llama_family_params(cfg, arch, family, common, moe)
    quant = data.get("quantization_config") or {}
    expert_bytes = None
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        expert_bytes = MXFP4_BYTES_PER_PARAM
    elif quant:
        raise ConfigError(f"model config {name!r}: quantization_config is not modelled")
    return ModelSpec(
        name=name,
        arch="llama",
        num_layers=common["num_layers"],
        hidden_size=common["hidden"],
        num_attention_heads=common["heads"],
        num_kv_heads=common["kv_heads"],
        head_size=common["head_size"],
        intermediate_size=common["intermediate"],
        vocab_size=cfg.int("vocab_size"),
        max_position_embeddings=cfg.int("max_position_embeddings"),
        num_params=params,
        dtype_bytes=_DTYPE_BYTES[dtype],
        sliding_window=window,
        hf_id=hf_id,
        layer_types=layer_types,
        num_experts=moe["experts"],
        num_experts_per_tok=moe["top_k"],
        moe_intermediate_size=moe["inter"],
        num_shared_experts=moe["shared"],
        num_dense_layers=moe["dense_layers"],
        num_expert_params=expert_params,
        expert_bytes_per_param=expert_bytes,
        kv_lora_rank=common.get("kv_lora_rank"),
        qk_rope_head_dim=common.get("rope", 0),
        v_head_dim=common.get("v_head", 0),
    )


def _attention_shape(cfg: _Config, arch: str) -> dict[str, Any]:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    shape: dict[str, Any] = {
        "hidden": hidden,
        "heads": heads,
        "num_layers": cfg.int("num_hidden_layers"),
        "intermediate": cfg.int("intermediate_size"),
    }
    if arch.startswith("Deepseek"):
        nope, rope = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim")
        shape.update(
            kv_heads=heads,
            head_size=nope + rope,
            kv_lora_rank=cfg.int("kv_lora_rank"),
            q_lora_rank=cfg.data.get("q_lora_rank"),
            nope=nope,
            rope=rope,
            v_head=cfg.int("v_head_dim"),
        )
        if shape["q_lora_rank"] is not None:
            shape["q_lora_rank"] = cfg.int("q_lora_rank")
        return shape
    if hidden % heads and not cfg.has("head_dim"):
        raise ConfigError(
            f"model config {cfg.name!r}: hidden_size={hidden} is not a multiple of "
            f"num_attention_heads={heads} and no head_dim is given"
        )
    kv_heads = cfg.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(
            f"model config {cfg.name!r}: num_attention_heads={heads} is not a multiple of "
            f"num_key_value_heads={kv_heads}"
        )
    shape.update(kv_heads=kv_heads, head_size=cfg.int("head_dim", hidden // heads))
    return shape


def _layer_pattern(cfg: _Config, arch: str, num_layers: int) -> tuple[tuple[str, ...], int | None]:
    """(layer_types, sliding_window): empty layer_types when every layer is alike."""
    window = cfg.data.get("sliding_window")
    if arch == "Qwen2ForCausalLM" or arch.startswith("Qwen3"):
        if not cfg.flag("use_sliding_window", False):
            window = None
    if window is None:
        kinds = ["full"] * num_layers
    else:
        window = cfg.int("sliding_window")
        if cfg.has("layer_types"):
            raw = cfg.data["layer_types"]
            if not isinstance(raw, list) or len(raw) != num_layers:
                raise ConfigError(
                    f"model config {cfg.name!r}: layer_types must list {num_layers} layers"
                )
            unknown = sorted({t for t in raw if t not in _LAYER_KINDS}, key=str)
            if unknown:
                raise ConfigError(
                    f"model config {cfg.name!r}: layer type {unknown[0]!r} is not modelled"
                )
            kinds = [_LAYER_KINDS[t] for t in raw]
        elif arch == "Gemma2ForCausalLM":  # even layers slide (transformers' Gemma2Config)
            kinds = ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]
        elif arch == "Qwen2ForCausalLM" or arch.startswith("Qwen3"):
            first = cfg.int("max_window_layers", num_layers, minimum=0)
            kinds = ["full" if i < first else "sliding" for i in range(num_layers)]
        else:
            kinds = ["sliding"] * num_layers
    if "sliding" not in kinds:
        return (), None
    if "full" not in kinds:
        return (), window
    return tuple(kinds), window


def _moe_shape(cfg: _Config, arch: str, family: str) -> dict[str, int]:
    none = {"experts": 0, "top_k": 0, "inter": 0, "shared": 0, "dense_layers": 0}
    if arch in ("MixtralForCausalLM", "GptOssForCausalLM"):
        return {
            **none,
            "experts": cfg.int("num_local_experts"),
            "top_k": cfg.int("num_experts_per_tok"),
            "inter": cfg.int("intermediate_size"),
        }
    if arch == "Qwen3MoeForCausalLM":
        if cfg.int("decoder_sparse_step", 1) != 1 or cfg.data.get("mlp_only_layers"):
            raise ConfigError(
                f"model config {cfg.name!r}: Qwen3-MoE with dense layers between MoE "
                "layers (decoder_sparse_step, mlp_only_layers) is not modelled"
            )
        return {
            **none,
            "experts": cfg.int("num_experts"),
            "top_k": cfg.int("num_experts_per_tok"),
            "inter": cfg.int("moe_intermediate_size"),
        }
    if family == "deepseek":
        if cfg.int("moe_layer_freq", 1) != 1:
            raise ConfigError(f"model config {cfg.name!r}: moe_layer_freq != 1 is not modelled")
        return {
            "experts": cfg.int("n_routed_experts"),
            "top_k": cfg.int("num_experts_per_tok"),
            "inter": cfg.int("moe_intermediate_size"),
            "shared": cfg.int("n_shared_experts", 0, minimum=0),
            "dense_layers": cfg.int("first_k_dense_replace", 0, minimum=0),
        }
    return none


def _llama_family_params(
    cfg: _Config, arch: str, family: str, a: dict[str, Any], moe: dict[str, int]
) -> tuple[int, int]:
    """(total parameters, of them routed-expert parameters), from the weight shapes."""
    h, layers, heads = a["hidden"], a["num_layers"], a["heads"]
    vocab = cfg.int("vocab_size")
    embed = vocab * h * (1 if cfg.flag("tie_word_embeddings", False) else 2)
    norms = 4 * h if arch == "Gemma2ForCausalLM" else 2 * h
    if family == "deepseek":
        nope, rope, v, rank = a["nope"], a["rope"], a["v_head"], a["kv_lora_rank"]
        q_rank = a["q_lora_rank"]
        q = (
            h * heads * (nope + rope)
            if q_rank is None
            else (h * q_rank + q_rank + q_rank * heads * (nope + rope))
        )
        attn = q + h * (rank + rope) + rank + rank * heads * (nope + v) + heads * v * h
    else:
        qd, kvd = heads * a["head_size"], a["kv_heads"] * a["head_size"]
        attn = 2 * h * qd + 2 * h * kvd
        if arch == "Qwen2ForCausalLM":
            attn += qd + 2 * kvd
        if arch.startswith("Qwen3"):
            attn += 2 * a["head_size"]  # q_norm, k_norm
        if arch == "GptOssForCausalLM":
            attn += qd + 2 * kvd + h + heads  # biases and the per-head sinks
    dense_mlp = 3 * h * a["intermediate"]
    experts = moe["experts"]
    expert = 3 * h * moe["inter"] + (2 * moe["inter"] + h if arch == "GptOssForCausalLM" else 0)
    router = h * experts + (experts if arch == "GptOssForCausalLM" else 0)
    moe_layers = 0 if experts == 0 else layers - moe["dense_layers"]
    routed = moe_layers * experts * expert
    shared = moe_layers * moe["shared"] * 3 * h * moe["inter"]
    mlp = (layers - moe_layers) * dense_mlp + routed + shared + moe_layers * router
    return embed + layers * (attn + norms) + mlp + h, routed


def _opt_spec(cfg: _Config, hf_id: str) -> ModelSpec:
    """OPT: LayerNorm + ReLU MLP with biases, learned positions (2 offset rows), tied head."""
    h, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    layers, inter = cfg.int("num_hidden_layers"), cfg.int("ffn_dim")
    vocab, max_pos = cfg.int("vocab_size"), cfg.int("max_position_embeddings")
    if cfg.int("word_embed_proj_dim", h) != h:
        raise ConfigError(f"model config {cfg.name!r}: word_embed_proj_dim != hidden_size")
    per_layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
    params = vocab * h + (max_pos + 2) * h + layers * per_layer + 2 * h
    dtype = cfg.data.get("torch_dtype", "float16")
    return ModelSpec(
        name=cfg.name,
        arch="opt",
        num_layers=layers,
        hidden_size=h,
        num_attention_heads=heads,
        num_kv_heads=heads,
        head_size=h // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        max_position_embeddings=max_pos,
        num_params=params,
        dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
        hf_id=hf_id,
    )
