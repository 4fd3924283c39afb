"""Sweep of kernel launch configs and decode splits on a few shapes (input to `configs.py`).

Run through `benchmarks/attention.py --sweep`. Each line: shape, the config tried, time per
call and (decode) % of copy bandwidth. The rules in `pagesim/gpu/kernels/configs.py` are
chosen from these numbers; the sweep itself never runs inside the library.
"""

from __future__ import annotations

import csv

import torch

from benchmarks.attention_timing import time_calls
from pagesim.gpu.kernels.configs import KernelConfig, decode_partition, fixed_partition
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace, paged_attention_decode
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill

DECODE_CONFIGS = [(32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (64, 8, 3),
                  (128, 4, 2), (128, 8, 3)]  # (tile_n, warps, stages)
DECODE_SHAPES = [("llama-3-8b", 32, 8, 32, 8192), ("llama-2-7b", 32, 32, 8, 2048)]
# (name, heads, kv_heads, batch, ctx)
SPLIT_SHAPES = [("llama-3-8b", 32, 8, 1, 8192), ("llama-3-8b", 32, 8, 8, 8192),
                ("llama-2-7b", 32, 32, 4, 8192), ("llama-3-8b", 32, 8, 32, 2048)]
SPLITS = (1, 2, 4, 8, 16, 32, 64)
PREFILL_CONFIGS = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3),
                   (128, 64, 4, 3), (64, 128, 4, 2)]  # (block_m, tile_n, warps, stages)
PREFILL_SHAPES = [("llama-3-8b", 32, 8, 8, 2048), ("llama-2-7b", 32, 32, 1, 8192)]


def _paged(batch, ctx, kv_heads, d, bs, n_rot, dtype):
    per_seq = ctx // bs
    num_blocks = 1 + n_rot * batch * per_seq
    kc = torch.randn(num_blocks, bs, kv_heads, d, dtype=dtype, device="cuda")
    vc = torch.randn_like(kc)
    perm = torch.randperm(num_blocks - 1, device="cuda") + 1
    return kc, vc, perm.view(n_rot, batch, per_seq).to(torch.int32)


def _decode_case(heads, kv_heads, batch, ctx, cfg, part, dtype=torch.float16, d=128, bs=16):
    kv_bytes = 2 * batch * ctx * kv_heads * d * 2
    n_rot = max(1, min(32, -(-3 * 60 * 2**20 // kv_bytes)))
    kc, vc, tables = _paged(batch, ctx, kv_heads, d, bs, n_rot, dtype)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qs = torch.randn(n_rot, batch, heads, d, dtype=dtype, device="cuda")
    outs = torch.empty_like(qs)
    ws = (DecodeWorkspace.allocate(batch, heads, d, part.num_partitions, "cuda")
          if part.num_partitions > 1 else None)
    calls = [(lambda r=r: paged_attention_decode(qs[r], kc, vc, tables[r], seq_lens, part,
                                                 out=outs[r], workspace=ws, config=cfg))
             for r in range(n_rot)]
    return time_calls(calls).median_s, kv_bytes


def _prefill_case(heads, kv, batch, ctx, cfg, d=128):
    tokens = batch * ctx
    kc, vc, tables = _paged(batch, ctx, kv, d, 16, 1, torch.float16)
    q = torch.randn(tokens, heads, d, dtype=torch.float16, device="cuda")
    out = torch.empty_like(q)
    qsl = torch.arange(0, tokens + 1, ctx, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    flops = 4 * batch * heads * d * ctx * (ctx + 1) / 2
    try:
        t = time_calls([lambda: paged_attention_prefill(q, kc, vc, tables[0], seq_lens, qsl,
                                                        out=out, config=cfg)]).median_s
        return dict(time_us=f"{t * 1e6:.1f}", tflops=f"{flops / t / 1e12:.0f}")
    except Exception as e:  # e.g. out of shared memory for this tile
        return dict(time_us="fail", tflops=str(e).splitlines()[0][:60])


def run_sweep(env: dict[str, str], copy_bw: float, csv_path: str) -> None:
    sms = int(env["sms"])
    rows = []

    def emit(**row):
        rows.append(row)
        print("  sweep " + " ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    for name, heads, kv, batch, ctx in DECODE_SHAPES:
        for tile, warps, stages in DECODE_CONFIGS:
            cfg = KernelConfig(16, tile, warps, stages)
            part = decode_partition(batch, kv, ctx, tile, sms)
            t, nbytes = _decode_case(heads, kv, batch, ctx, cfg, part)
            torch.cuda.empty_cache()
            emit(kind="decode_cfg", shape=f"{name} b{batch} ctx{ctx}",
                 config=f"tile{tile} w{warps} s{stages} p{part.num_partitions}",
                 time_us=f"{t * 1e6:.1f}", pct_copy_bw=f"{100 * nbytes / t / copy_bw:.1f}")
    for name, heads, kv, batch, ctx in SPLIT_SHAPES:
        rule = decode_partition(batch, kv, ctx, 64, sms).num_partitions
        for splits in SPLITS:
            part = fixed_partition(ctx, -(-ctx // splits), 64)
            t, nbytes = _decode_case(heads, kv, batch, ctx, None, part)
            torch.cuda.empty_cache()
            emit(kind="decode_split", shape=f"{name} b{batch} ctx{ctx}",
                 config=f"p{part.num_partitions} (rule p{rule})", time_us=f"{t * 1e6:.1f}",
                 pct_copy_bw=f"{100 * nbytes / t / copy_bw:.1f}")
    for name, heads, kv, batch, ctx in PREFILL_SHAPES:
        for bm, tn, warps, stages in PREFILL_CONFIGS:
            res = _prefill_case(heads, kv, batch, ctx, KernelConfig(bm, tn, warps, stages))
            torch.cuda.empty_cache()
            emit(kind="prefill_cfg", shape=f"{name} b{batch} ctx{ctx}",
                 config=f"m{bm} n{tn} w{warps} s{stages}", **res)
    keys = sorted({k for r in rows for k in r})
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
