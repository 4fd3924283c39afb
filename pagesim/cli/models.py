"""`pagesim models`: the models and GPUs pagesim knows, with the numbers that size a KV cache
and price a step, and which pairs have a shipped calibration profile."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from pagesim.cli.app import app
from pagesim.data import calibration_dir
from pagesim.hf_config import shipped_models
from pagesim.kvcache.sizing import kv_bytes_per_token
from pagesim.specs import GPUS, MODELS, GiB, ModelSpec
from pagesim.utils import readable


def model_rows() -> list[dict[str, Any]]:
    """One row per shipped model config: shape, context, weights, KV bytes per token."""
    root = calibration_dir()
    rows = []
    names = [*MODELS, *(name for name in shipped_models() if name not in MODELS)]
    for name in names:
        m = ModelSpec.from_name(name)
        profiled = sorted(g.name for g in root.iterdir() if (g / name / "profile.json").is_file())
        rows.append(
            {
                "model": name,
                "hf_id": m.hf_id or "-",
                "params_b": m.num_params / 1e9,
                "layers": m.num_layers,
                "heads": f"{m.num_attention_heads}/{m.num_kv_heads}",
                "head_size": m.head_size,
                "max_model_len": m.max_position_embeddings,
                "weights_gib": m.weight_bytes / GiB,
                "kv_kib_per_token": kv_bytes_per_token(m) / 1024,
                "profiles": ",".join(profiled) or "-",
            }
        )
    return rows


def gpu_rows() -> list[dict[str, Any]]:
    """One row per known GPU: memory and the datasheet rates the analytical model uses."""
    return [
        {
            "gpu": name,
            "memory_gib": g.memory_bytes / GiB,
            "hbm_tb_s": g.hbm_bandwidth_bytes_per_s / 1e12,
            "fp16_tflops": g.fp16_flops / 1e12,
            "host_link_gb_s": g.host_link_bytes_per_s / 1e9,
            "nvlink_gb_s": g.nvlink_bytes_per_s / 1e9,
        }
        for name, g in GPUS.items()
    ]


MODEL_COLUMNS = (
    f"{'Hugging Face id':<34} {'params':>7} {'layers':>6} {'heads q/kv':>10} "
    f"{'head':>4} {'context':>7} {'weights':>9} {'KV/token':>9}  profiles"
)
GPU_HEADER = f"{'gpu':<10} {'memory':>8} {'HBM':>9} {'fp16':>12} {'host link':>10} {'NVLink':>9}"


@app.command("models")
def models_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead.")] = False,
) -> None:
    """List the known models and GPUs (names for --model and --gpu) with their key numbers."""
    models, gpus = model_rows(), gpu_rows()
    if as_json:
        print(json.dumps({"models": models, "gpus": gpus}, indent=2))
        return
    width = max(14, *(len(r["model"]) for r in models))
    print(f"{'model':<{width}} {MODEL_COLUMNS}")
    for r in models:
        print(
            f"{r['model']:<{width}} {r['hf_id']:<34} {_count(r['params_b'] * 1e9):>7} "
            f"{r['layers']:>6} {r['heads']:>10} {r['head_size']:>4} {r['max_model_len']:>7} "
            f"{readable(r['weights_gib'], 3):>5} GiB {readable(r['kv_kib_per_token'], 3):>5} KiB  "
            f"{r['profiles']}"
        )
    print(
        "(KV/token: K and V (MLA: latent + rope) of one token over all layers at 16 bits, on "
        "one GPU; profiles: GPUs with a shipped calibration profile)"
    )
    print()
    print(GPU_HEADER)
    for r in gpus:
        print(
            f"{r['gpu']:<10} {r['memory_gib']:4.1f} GiB {r['hbm_tb_s']:4.2f} TB/s "
            f"{r['fp16_tflops']:5.0f} TFLOP/s {r['host_link_gb_s']:5.0f} GB/s "
            f"{r['nvlink_gb_s']:4.0f} GB/s"
        )
    print("(datasheet peaks: dense fp16 tensor FLOP/s, one direction for the links)")


def _count(n: float) -> str:
    """A parameter count: 6.74B, 427K (never an exponent)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.0f}"
