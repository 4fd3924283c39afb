"""Sweep of decode launch configs and split counts on a few shapes (input to `configs.py`).

Run through `benchmarks/attention.py --sweep-only`. Each line: shape, config, split count, the
split the rule in `pagesim/gpu/kernels/configs.py` would choose, time per call and % of copy
bandwidth. The rules are chosen from these numbers; the sweep never runs inside the library.
"""

from __future__ import annotations

import csv

import torch

from benchmarks.attention_timing import time_calls
from pagesim.gpu.kernels.configs import KernelConfig, decode_partition, fixed_partition
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace, paged_attention_decode

# Decode configs compared across split counts: (tile_n, warps, stages, programs per SM).
DECODE_CONFIGS = [(64, 4, 3, 4), (128, 8, 3, 2)]
SPLIT_SHAPES = [
    ("llama-3-8b", 32, 8, 1, 8192),
    ("llama-3-8b", 32, 8, 8, 8192),
    ("llama-2-7b", 32, 32, 4, 8192),
    ("llama-3-8b", 32, 8, 32, 2048),
    ("llama-2-7b", 32, 32, 8, 2048),
    ("llama-3-8b", 32, 8, 32, 8192),
    ("llama-3-8b", 32, 8, 8, 512),
    ("llama-2-7b", 32, 32, 32, 2048),
]
SPLITS = (1, 2, 3, 4, 6, 8, 16, 32, 64)
# Head size 256 (e.g. 16 query / 2 KV heads): (tile_n, warps, stages, programs per SM).
DECODE_CONFIGS_256 = [(64, 8, 2, 2), (32, 4, 3, 2), (64, 4, 2, 2)]
# "short": the final config on short contexts, where the reduction launch decides the split.
SHORT_SHAPES = [
    ("llama-3-8b", 32, 8, 32, 512),
    ("llama-2-7b", 32, 32, 8, 512),
    ("llama-3-8b", 32, 8, 1, 512),
    ("llama-3-8b", 32, 8, 8, 512),
    ("llama-2-7b", 32, 32, 1, 2048),
    ("llama-3-8b", 32, 8, 128, 512),
]
SWEEP_SETS = {
    "splits": (DECODE_CONFIGS, SPLIT_SHAPES, SPLITS, True),
    "short": ([(64, 4, 3, 4)], SHORT_SHAPES, (1, 2, 4), False),
}


def _paged(batch, ctx, kv_heads, d, bs, n_rot, dtype):
    per_seq = ctx // bs
    num_blocks = 1 + n_rot * batch * per_seq
    kc = torch.randn(num_blocks, bs, kv_heads, d, dtype=dtype, device="cuda")
    vc = torch.randn_like(kc)
    perm = torch.randperm(num_blocks - 1, device="cuda") + 1
    return kc, vc, perm.view(n_rot, batch, per_seq).to(torch.int32)


def _decode_case(heads, kv_heads, batch, ctx, cfg, part, dtype=torch.float16, d=128, bs=16):
    """Seconds per decode call (graph replay over rotated inputs) and the KV bytes it reads."""
    kv_bytes = 2 * batch * ctx * kv_heads * d * 2
    n_rot = max(1, min(32, -(-3 * 60 * 2**20 // kv_bytes)))
    kc, vc, tables = _paged(batch, ctx, kv_heads, d, bs, n_rot, dtype)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qs = torch.randn(n_rot, batch, heads, d, dtype=dtype, device="cuda")
    outs = torch.empty_like(qs)
    ws = (
        DecodeWorkspace.allocate(batch, heads, d, part.num_partitions, "cuda")
        if part.num_partitions > 1
        else None
    )
    calls = [
        (
            lambda r=r: paged_attention_decode(
                qs[r], kc, vc, tables[r], seq_lens, part, out=outs[r], workspace=ws, config=cfg
            )
        )
        for r in range(n_rot)
    ]
    return time_calls(calls).median_s, kv_bytes


def run_sweep(
    env: dict[str, str], copy_bw: float, csv_path: str, sweep_set: str = "splits"
) -> None:
    """Time decode over `SWEEP_SETS[sweep_set]` (configs x shapes x split counts)."""
    configs, shapes, splits_list, with_256 = SWEEP_SETS[sweep_set]
    sms = int(env["sms"])
    rows = []

    def emit(**row):
        rows.append(row)
        print("  sweep " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for name, heads, kv, batch, ctx in shapes:
        for tile, warps, stages, per_sm in configs:
            cfg = KernelConfig(16, tile, warps, stages, per_sm)
            rule = decode_partition(batch, kv, ctx, cfg, sms).num_partitions
            seen = set()
            for splits in splits_list:
                part = fixed_partition(ctx, -(-ctx // splits), tile)
                if part.num_partitions in seen or part.partition_size < 128:
                    continue
                seen.add(part.num_partitions)
                t, nbytes = _decode_case(heads, kv, batch, ctx, cfg, part)
                torch.cuda.empty_cache()
                emit(
                    kind="decode_split",
                    shape=f"{name} b{batch} ctx{ctx}",
                    config=f"tile{tile} w{warps} s{stages}",
                    splits=part.num_partitions,
                    rule=rule,
                    time_us=f"{t * 1e6:.1f}",
                    pct_copy_bw=f"{100 * nbytes / t / copy_bw:.1f}",
                )
    for tile, warps, stages, per_sm in DECODE_CONFIGS_256 if with_256 else []:
        cfg = KernelConfig(16, tile, warps, stages, per_sm)
        part = decode_partition(8, 2, 8192, cfg, sms)
        t, nbytes = _decode_case(16, 2, 8, 8192, cfg, part, d=256)
        torch.cuda.empty_cache()
        emit(
            kind="decode_cfg256",
            shape="16/2/256 b8 ctx8192",
            config=f"tile{tile} w{warps} s{stages}",
            splits=part.num_partitions,
            rule=part.num_partitions,
            time_us=f"{t * 1e6:.1f}",
            pct_copy_bw=f"{100 * nbytes / t / copy_bw:.1f}",
        )
    keys = sorted({k for r in rows for k in r})
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
