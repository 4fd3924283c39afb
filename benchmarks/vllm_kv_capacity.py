"""Record vLLM's own KV cache spec and block count for the shipped model configs.

    VLLM_TARGET_DEVICE=cpu PYTHONPATH=<vllm 0.33 sources> /work/venv-vllm/bin/python \\
        benchmarks/vllm_kv_capacity.py [--out pagesim/data/parity/kv_capacity/vllm-0.33.json]

Runs in a separate environment with vLLM installed (see the parity notes); imports nothing
from pagesim. For each config it builds vLLM's `ModelConfig` from the shipped config.json
(the architecture, dtype, head size, KV heads and layer count are vLLM's reading of it), one
`KVCacheSpec` per attention layer (full, sliding window per the config's layer types, or MLA),
and lets vLLM group the layers (`get_kv_cache_groups`), size the pool for a fixed KV budget
(`get_kv_cache_config_from_groups`) and compute the maximum concurrency. The JSON it writes is
the golden file `tests/kvcache/test_sizing_vllm.py` compares `pagesim kv-capacity` against.
Prints one line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

MODELS = (
    "llama-2-7b",
    "llama-3-8b",
    "mistral-7b",
    "qwen2.5-7b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "gemma-2-9b",
    "gpt-oss-20b",
)
BLOCK_SIZES = (16, 32)
BUDGET_BYTES = 40 * 1024**3  # one fixed KV budget: the comparison is of specs and counts
MAX_NUM_BATCHED_TOKENS = 8192
LAYOUT = "LBHNC"  # [layer, block, head, token, channel]: the identity layout


def vllm_case(name: str, config_dir: Path, block_size: int) -> dict:
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.kv_cache_planning import (
        get_kv_cache_config_from_groups,
        get_kv_cache_groups,
    )
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    mc = ModelConfig(
        model=str(config_dir), skip_tokenizer_init=True, dtype="auto", seed=0, enforce_eager=True
    )
    sc = SchedulerConfig(
        max_num_seqs=256,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        max_model_len=mc.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
    )
    cc = CacheConfig(block_size=block_size)
    cc.kv_cache_layout = LAYOUT  # the engine core resolves it from the attention backend
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc)
    pc = vc.parallel_config
    layers, kv_heads, head = mc.get_num_layers(pc), mc.get_num_kv_heads(pc), mc.get_head_size()
    hf = mc.hf_text_config
    window = getattr(hf, "sliding_window", None)
    types = getattr(hf, "layer_types", None) or ["full_attention"] * layers
    if getattr(hf, "use_sliding_window", True) is False:
        window = None
    dtype = mc.dtype
    specs = {}
    for i in range(layers):
        lname = f"model.layers.{i}.self_attn.attn"
        if mc.use_mla:
            specs[lname] = MLAAttentionSpec(
                block_size=block_size, num_kv_heads=1, head_size=head, dtype=dtype
            )
        elif window is not None and (
            types[i] == "sliding_attention" or not hasattr(hf, "layer_types")
        ):
            specs[lname] = SlidingWindowSpec(
                block_size=block_size,
                num_kv_heads=kv_heads,
                head_size=head,
                dtype=dtype,
                sliding_window=window,
            )
        else:
            specs[lname] = FullAttentionSpec(
                block_size=block_size, num_kv_heads=kv_heads, head_size=head, dtype=dtype
            )
    groups = get_kv_cache_groups(vc, specs)
    kvc = get_kv_cache_config_from_groups(vc, groups, BUDGET_BYTES)
    return {
        "model": name,
        "block_size": block_size,
        "available_kv_cache_memory_bytes": BUDGET_BYTES,
        "max_model_len": mc.max_model_len,
        "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
        "dtype": str(dtype).removeprefix("torch."),
        "use_mla": bool(mc.use_mla),
        "per_layer_page_size_bytes": sorted({s.page_size_bytes for s in specs.values()}),
        "groups": [[type(g.kv_cache_spec).__name__, len(g.layer_names)] for g in groups],
        "num_blocks": kvc.num_blocks,
        "max_concurrency": get_max_concurrency_for_kv_cache_config(vc, kvc),
        "max_in_flight_tokens": vc.max_in_flight_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="pagesim/data/models")
    ap.add_argument("--out", default="pagesim/data/parity/kv_capacity/vllm-0.33.json")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import vllm

    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            folder = Path(tmp) / name
            folder.mkdir()
            config = json.loads((Path(args.configs) / f"{name}.json").read_text())
            # Weight quantization (gpt-oss's MXFP4 experts) does not enter the KV cache spec,
            # and vLLM's MXFP4 path needs packages a CPU install lacks.
            config.pop("quantization_config", None)
            (folder / "config.json").write_text(json.dumps(config))
            for bs in BLOCK_SIZES:
                case = vllm_case(name, folder, bs)
                print(json.dumps(case), flush=True)
                cases.append(case)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"vllm": vllm.__version__, "cases": cases}, indent=1) + "\n")
    print(f"wrote {out} ({len(cases)} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
