"""A SYNTHETIC calibration profile for tests: generated, never measured.

The numbers come from `AnalyticalCostModel` on llama-2-7b shapes and H200 datasheet rates, with
2 % multiplicative noise from a seeded generator, so that the calibrated model and `fit_report`
have realistic shapes to work on. It must never be shipped or read as a calibration of any GPU.

Regenerate the on-disk copy (tests/cost/data/synthetic-profile/) with

    python tests/cost/synthetic_profile.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pagesim.cost.analytical import AnalyticalConstants, AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.profile import (
    DecodeRow,
    MixedRow,
    OverheadRow,
    PrefillRow,
    Profile,
    ProfileMetadata,
)
from pagesim.specs import GiB, GPUSpec, ModelSpec

FIXTURE_DIR = Path(__file__).parent / "data" / "synthetic-profile"

# llama-2-7b shapes (HF config.json of meta-llama/Llama-2-7b-hf), under a synthetic name.
MODEL = ModelSpec(
    name="synthetic-llama-7b",
    arch="llama",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=32,
    head_size=128,
    intermediate_size=11008,
    vocab_size=32000,
    max_position_embeddings=4096,
    num_params=6_738_415_616,
)
# H200 SXM datasheet rates, under a synthetic name: 141 GB HBM3e at 4.8 TB/s, 989.5 dense
# fp16 TFLOP/s, PCIe Gen5 x16 (64 GB/s per direction), NVLink 900 GB/s (450 per direction).
GPU = GPUSpec(
    name="synthetic-gpu",
    memory_bytes=141 * 10**9,
    hbm_bandwidth_bytes_per_s=4.8e12,
    fp16_flops=989.5e12,
    host_link_bytes_per_s=64e9,
    nvlink_bytes_per_s=450e9,
)

# The generating model's constants, pinned here so that the fixture does not move when the
# analytical defaults are refitted: round datasheet-style efficiencies, no per-layer time.
CONSTANTS = AnalyticalConstants(
    weight_bandwidth_efficiency=0.85,
    gemm_flops_efficiency=0.70,
    attention_bandwidth_efficiency=0.70,
    attention_flops_efficiency=0.50,
    paged_block_overhead_tokens=4.0,
    per_layer_overhead_s=0.0,
    step_overhead_s=1.0e-3,
    per_request_overhead_s=5.0e-6,
)

BLOCK_SIZES = (8, 16, 32)
BATCH_SIZES = (1, 4, 16, 64, 256)
CONTEXT_LENS = (16, 128, 1024, 4096)
MAX_DECODE_KV_TOKENS = 256 * 1024  # ragged grid: larger decode batches "do not fit"
NEW_TOKENS = (16, 64, 256, 1024, 4096)
CACHED_TOKENS = (0, 512, 2048)
MIXED = [(n, c, b, 512) for n in (256, 1024) for c in (0, 1024) for b in (8, 64)]
NUM_REQS = (1, 16, 64, 256)


def generating_model(tensor_parallel_size: int = 1) -> AnalyticalCostModel:
    """The analytical model the synthetic rows are drawn from."""
    return AnalyticalCostModel(
        MODEL, GPU, tensor_parallel_size=tensor_parallel_size, constants=CONSTANTS
    )


def make_synthetic_profile(noise: float = 0.02, seed: int = 0) -> Profile:
    """Device times from the analytical model times (1 + noise * N(0, 1)), in ms, rounded."""
    cm = generating_model()
    rng = np.random.default_rng(seed)

    def measure(shape: BatchShape) -> tuple[float, ...]:
        bd = cm.step_time_breakdown(shape)
        attention = (bd["attention"] + bd["paged_blocks"]) * 1e3
        other = bd["linear"] * 1e3
        f = 1.0 + noise * float(rng.standard_normal())
        step = (attention + other) * f
        return (
            round(step, 5),
            round(step * 0.98, 5),
            round(step * 1.03, 5),
            round(attention * f, 5),
            round(other * f, 5),
        )

    decode, prefill, mixed = [], [], []
    for bs in BLOCK_SIZES:
        for b in BATCH_SIZES:
            for c in CONTEXT_LENS:
                if b * c <= MAX_DECODE_KV_TOKENS:
                    decode.append(DecodeRow(bs, b, c, *measure(BatchShape.decode(b, c, bs))))
        for n in NEW_TOKENS:
            for c in CACHED_TOKENS:
                prefill.append(PrefillRow(bs, n, c, *measure(BatchShape.prefill(n, c, bs))))
        for n, c, b, dc in MIXED:
            mixed.append(MixedRow(bs, n, c, b, dc, *measure(BatchShape.mixed(n, c, b, dc, bs))))
    k = cm.constants
    overhead = [
        OverheadRow(
            n,
            *(
                round((k.step_overhead_s + k.per_request_overhead_s * n) * 1e3 * s, 5)
                for s in (1.0, 0.95, 1.1)
            ),
        )
        for n in NUM_REQS
    ]
    meta = ProfileMetadata(
        gpu=GPU.name,
        model=MODEL.name,
        gpu_name="SYNTHETIC (no device)",
        driver="n/a",
        cuda="n/a",
        torch="n/a",
        triton="n/a",
        dtype="float16",
        date="2026-01-01",
        attention_backend="none (analytical model)",
        grid={
            "block_size": list(BLOCK_SIZES),
            "batch_size": list(BATCH_SIZES),
            "context_len": list(CONTEXT_LENS),
            "num_new_tokens": list(NEW_TOKENS),
            "num_cached_tokens": list(CACHED_TOKENS),
        },
        num_gpu_blocks={bs: (100 * GiB) // (bs * cm.kv_bytes_per_token) for bs in BLOCK_SIZES},
        gpu_memory_utilization=0.92,
        method=f"generated: AnalyticalCostModel, noise={noise}, seed={seed}",
        synthetic=True,
        notes="SYNTHETIC test fixture generated by tests/cost/synthetic_profile.py; "
        "not a measurement of any GPU",
    )
    return Profile(meta, tuple(decode), tuple(prefill), tuple(mixed), tuple(overhead))


if __name__ == "__main__":
    print(make_synthetic_profile().save(FIXTURE_DIR))
