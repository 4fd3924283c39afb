"""KV sizing against hand-computed numbers, vLLM's log format, and bad configs."""

from __future__ import annotations

import math

import pytest

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError, UnknownNameError
from pagesim.kvcache.sizing import (
    NonKVMemory,
    blocks_per_request,
    estimate_activation_peak_bytes,
    kv_bytes_per_token,
    kv_cache_dtype_bytes,
    kv_capacity,
    max_concurrency,
    num_gpu_blocks,
    num_kv_heads_per_gpu,
    page_size_bytes,
)
from pagesim.specs import MODELS, GiB

MiB = 1024**2


def test_bytes_per_token_llama2_7b():
    m = MODELS["llama-2-7b"]
    # 2 (K,V) * 32 layers * 32 heads * 128 * 2 bytes = 512 KiB
    assert kv_bytes_per_token(m) == 524_288
    assert page_size_bytes(m, 16) == 8 * MiB
    assert kv_bytes_per_token(m, "fp8") == 262_144
    assert kv_bytes_per_token(m, "fp8_e5m2", tensor_parallel_size=2) == 131_072


def test_bytes_per_token_gqa_and_tp():
    m = MODELS["llama-2-70b"]  # 80 layers, 8 KV heads
    assert kv_bytes_per_token(m) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert num_kv_heads_per_gpu(m, 4) == 2
    assert num_kv_heads_per_gpu(m, 8) == 1
    assert num_kv_heads_per_gpu(m, 16) == 1  # replicated past tp = num_kv_heads
    assert kv_bytes_per_token(m, tensor_parallel_size=16) == 2 * 80 * 1 * 128 * 2
    q = MODELS["qwen2.5-7b"]  # 28 layers, 4 KV heads
    assert kv_bytes_per_token(q) == 2 * 28 * 4 * 128 * 2 == 57_344
    opt = MODELS["opt-13b"]
    assert kv_bytes_per_token(opt) == 2 * 40 * 40 * 128 * 2 == 819_200  # vLLM paper: 800 KB


def test_kv_dtype():
    m = MODELS["llama-3-8b"]
    assert kv_cache_dtype_bytes(m, "auto") == 2
    assert kv_cache_dtype_bytes(m, "fp8_e4m3") == 1
    with pytest.raises(ConfigError, match="kv_cache_dtype='int3'"):
        kv_cache_dtype_bytes(m, "int3")


def test_llama2_7b_on_h200_by_hand():
    c = EngineConfig.create(
        model="llama-2-7b", gpu="h200", gpu_memory_utilization=0.92, block_size=16
    )
    assert (c.max_num_batched_tokens, c.max_num_seqs, c.max_model_len) == (8192, 1024, 4096)
    total = round(139.81 * GiB)
    requested = math.ceil(total * 0.92)
    weights = 6_738_415_616 * 2
    # forward: 8192 tokens * (2 * 4096 residual/hidden + 3 * 11008 SwiGLU) * 2 bytes
    # logits: min(1024, 8192) rows * 32000 * 12 bytes
    act = 8192 * (2 * 4096 + 3 * 11008) * 2 + 1024 * 32000 * 12
    assert act == 1_068_498_944
    assert estimate_activation_peak_bytes(MODELS["llama-2-7b"], 8192, 1024) == act
    available = requested - weights - act - 256 * MiB
    cap = kv_capacity(c)
    assert cap.source == "gpu_memory_utilization"
    assert cap.available_kv_cache_memory_bytes == available
    assert cap.num_gpu_blocks == available // (8 * MiB) == 14_698
    assert num_gpu_blocks(c) == 14_698
    assert cap.num_tokens == 14_698 * 16
    assert cap.blocks_per_request == 256
    assert cap.max_concurrency == pytest.approx(14_698 / 256)
    assert cap.report().splitlines() == [
        f"Available KV cache memory: {available / GiB:.2f} GiB",
        "GPU KV cache size: 235,168 tokens",
        "Maximum concurrency for 4,096 tokens per request: 57.41x",
    ]


def test_report_format_regex():
    import re

    lines = kv_capacity(EngineConfig.create(model="llama-3.1-8b", gpu="h200")).report().splitlines()
    assert re.fullmatch(r"Available KV cache memory: \d+\.\d\d GiB", lines[0])
    assert re.fullmatch(r"GPU KV cache size: \d{1,3}(,\d{3})* tokens", lines[1])
    assert re.fullmatch(r"Maximum concurrency for 131,072 tokens per request: \d+\.\d\dx", lines[2])


def test_override_and_kv_memory_bytes():
    c = EngineConfig.create(model="llama-2-7b", gpu="h200", num_gpu_blocks_override=100)
    cap = kv_capacity(c)
    assert (cap.num_gpu_blocks, cap.source, cap.non_kv) == (100, "num_gpu_blocks_override", None)
    assert cap.available_kv_cache_memory_bytes == 100 * 8 * MiB
    # the override skips every memory check: 70B on one GPU, one block
    c = EngineConfig.create(model="llama-2-70b", gpu="a10g", num_gpu_blocks_override=1)
    assert num_gpu_blocks(c) == 1
    c = EngineConfig.create(model="llama-2-7b", gpu="h200", kv_cache_memory_bytes=10 * GiB)
    cap = kv_capacity(c)
    assert cap.num_gpu_blocks == 10 * GiB // (8 * MiB) == 1280
    assert cap.source == "kv_cache_memory_bytes"
    assert cap.report().splitlines()[0] == "Available KV cache memory: 10.00 GiB"


def test_measured_non_kv_replaces_estimate():
    c = EngineConfig.create(model="llama-2-7b", gpu="h200")
    measured = NonKVMemory(weights_bytes=13 * GiB, activation_peak_bytes=2 * GiB, non_torch_bytes=0)
    cap = kv_capacity(c, non_kv=measured)
    assert cap.non_kv == measured
    assert cap.available_kv_cache_memory_bytes == math.ceil(round(139.81 * GiB) * 0.92) - 15 * GiB


def test_tensor_parallel_shards_weights_and_heads():
    one = kv_capacity(EngineConfig.create(model="llama-3-70b", gpu="h200", tensor_parallel_size=2))
    four = kv_capacity(EngineConfig.create(model="llama-3-70b", gpu="h200", tensor_parallel_size=4))
    assert one.page_size_bytes == 2 * four.page_size_bytes
    assert four.non_kv.weights_bytes == -(-MODELS["llama-3-70b"].weight_bytes // 4)
    assert four.num_gpu_blocks > 2 * one.num_gpu_blocks


def test_fp8_doubles_blocks_roughly():
    a = kv_capacity(EngineConfig.create(model="llama-3-8b", gpu="h100-sxm"))
    b = kv_capacity(EngineConfig.create(model="llama-3-8b", gpu="h100-sxm", kv_cache_dtype="fp8"))
    assert b.page_size_bytes * 2 == a.page_size_bytes
    assert b.num_gpu_blocks in (2 * a.num_gpu_blocks, 2 * a.num_gpu_blocks + 1)


def test_sliding_window_blocks_per_request():
    m = MODELS["mistral-7b"]
    # min(4096 - 1 + 2048, 32768) = 6143 tokens -> 384 blocks, + 1 for the unaligned start
    assert blocks_per_request(m, 32768, 16, 2048) == 385
    assert blocks_per_request(m, 1000, 16, 2048) == 64  # short request: ceil(1000/16) + 1
    assert blocks_per_request(MODELS["llama-2-7b"], 1000, 16, 2048) == 63
    cap = kv_capacity(EngineConfig.create(model="mistral-7b", gpu="a100-80gb"))
    assert cap.blocks_per_request == 385
    assert cap.max_concurrency == pytest.approx(cap.num_gpu_blocks / 385)


def test_max_concurrency_formula():
    assert max_concurrency(1000, 256) == pytest.approx(3.90625)
    # block rounding: 4097 tokens need 257 blocks of 16
    assert blocks_per_request(MODELS["llama-2-7b"], 4097, 16, 8192) == 257


def test_weights_do_not_fit():
    with pytest.raises(ConfigError) as e:
        kv_capacity(EngineConfig.create(model="llama-2-70b", gpu="a100-80gb"))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("weights of llama-2-70b (128.5 GiB)")
    assert "do not fit" in msg and "tensor_parallel_size=1" in msg
    # fits the weights on h200 but leaves nothing for the KV cache
    with pytest.raises(ConfigError, match=r"weights of llama-2-70b \(128.5 GiB\) leave no KV"):
        num_gpu_blocks(EngineConfig.create(model="llama-2-70b", gpu="h200"))
    assert (
        num_gpu_blocks(EngineConfig.create(model="llama-2-70b", gpu="h200", tensor_parallel_size=2))
        > 0
    )


def test_max_model_len_does_not_fit():
    with pytest.raises(ConfigError, match="max_model_len=131072 needs 16.00 GiB"):
        kv_capacity(EngineConfig.create(model="llama-3.1-8b", gpu="a10g"))
    assert (
        num_gpu_blocks(EngineConfig.create(model="llama-3.1-8b", gpu="a10g", max_model_len=8192))
        > 512
    )


def test_tiny_kv_memory():
    with pytest.raises(ConfigError, match="holds no block"):
        kv_capacity(EngineConfig.create(model="llama-2-7b", gpu="h200", kv_cache_memory_bytes=1000))


def test_unknown_names():
    with pytest.raises(UnknownNameError, match="unknown model 'gpt-5'"):
        num_gpu_blocks(EngineConfig(model="gpt-5"))
    with pytest.raises(UnknownNameError, match="unknown GPU 'tpu'"):
        num_gpu_blocks(EngineConfig(gpu="tpu"))


def test_to_dict_is_plain():
    import json

    d = kv_capacity(EngineConfig.create(model="llama-2-7b", gpu="h200")).to_dict()
    json.dumps(d)
    assert d["num_tokens"] == d["num_gpu_blocks"] * 16
    assert d["non_kv"]["weights_bytes"] == 13_476_831_232
