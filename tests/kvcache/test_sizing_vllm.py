"""`pagesim kv-capacity` against vLLM 0.33's own KV cache spec and block count.

The golden file holds what vLLM computed on a CPU from the same shipped config.json files
(`benchmarks/vllm_kv_capacity.py` re-records it): its per-layer page size, KV cache groups,
block count for a fixed KV budget, and maximum concurrency at max_model_len.
"""

from __future__ import annotations

import json

import pytest

from pagesim.config import EngineConfig
from pagesim.data import golden_dir
from pagesim.kvcache.sizing import (
    kv_bytes_per_token_per_layer,
    kv_cache_groups,
    kv_capacity,
)

GOLDEN = json.loads((golden_dir() / "kv_capacity" / "vllm-0.33.json").read_text())
CASES = GOLDEN["cases"]
SPEC_KIND = {
    "FullAttentionSpec": "full",
    "MLAAttentionSpec": "full",
    "SlidingWindowSpec": "sliding",
}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['model']}-bs{c['block_size']}" for c in CASES])
def test_kv_capacity_matches_vllm(case: dict) -> None:
    config = EngineConfig.create(
        model=case["model"],
        block_size=case["block_size"],
        max_model_len=case["max_model_len"],
        max_num_batched_tokens=case["max_num_batched_tokens"],
        kv_cache_memory_bytes=case["available_kv_cache_memory_bytes"],
    )
    model = config.model_spec
    assert model.use_mla == case["use_mla"]
    per_layer = case["block_size"] * kv_bytes_per_token_per_layer(model)
    assert [per_layer] == case["per_layer_page_size_bytes"]
    groups = kv_cache_groups(model, hybrid_kv_cache_manager=True)
    expected = [(SPEC_KIND[kind], n) for kind, n in case["groups"]]
    assert sorted(groups) == sorted(expected)
    cap = kv_capacity(config)
    assert cap.num_gpu_blocks == case["num_blocks"]
    if case["max_in_flight_tokens"] == case["max_num_batched_tokens"]:
        assert cap.max_concurrency == pytest.approx(case["max_concurrency"], rel=1e-12)


def test_golden_covers_every_new_family() -> None:
    models = {c["model"] for c in CASES}
    assert {"mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gemma-2-9b"} <= models
    assert GOLDEN["vllm"].startswith("0.33")
