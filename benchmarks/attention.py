"""Speed of the Triton paged-attention kernels on the local GPU, against PyTorch SDPA.

    PYTHONPATH=. python benchmarks/attention.py --out results [--sweep] [--quick]

Decode: one query token per sequence over a paged KV cache; reported as time, KV bytes read
per second and % of this card's device-to-device copy bandwidth (measured in the same run: a
large `torch` copy, bytes read + written), and as the ratio to SDPA (cuDNN and flash backends)
on contiguous K/V of the same shape (`enable_gqa=True` for GQA; if a backend refuses it the K/V
are repeated per query head beforehand, and the `gqa` column says `repeat`). Prefill: causal
attention of whole prompts, ratio to SDPA causal. Ratios are `t_sdpa / t_triton` (> 1: the
Triton kernel is faster).

Timing: CUDA graphs of many calls over rotated inputs (separate block tables / K/V / queries
whose total exceeds 3x the L2), replayed 10 times after warm-up; the median per call is
reported with the min-max spread. Writes `attention_h200.csv` and `attention_h200.md` (the
file stem follows `--name`). Needs only torch, triton and pagesim.gpu / pagesim.kvcache.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
import os
import signal
import subprocess
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.attention_timing import time_calls  # noqa: E402
from pagesim.gpu.kernels.configs import (  # noqa: E402
    KernelConfig,
    decode_config,
    decode_partition,
)
from pagesim.gpu.kernels.paged_attention import (  # noqa: E402
    DecodeWorkspace,
    paged_attention_decode,
)
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill  # noqa: E402

MODELS = {"llama-2-7b": (32, 32, 128), "llama-3-8b": (32, 8, 128)}  # (heads, kv heads, D)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
BATCHES = (1, 8, 32, 128)
CONTEXTS = (512, 2048, 8192)
BLOCK_SIZES = (16, 32)
PREFILL_MAX_TOKENS = 65536  # prefill shapes with batch x context above this are skipped
FIELDS = [
    "kind",
    "model",
    "dtype",
    "batch",
    "context",
    "block_size",
    "impl",
    "gqa",
    "time_us",
    "spread_us",
    "kv_bytes",
    "kv_gbps",
    "pct_copy_bw",
    "tflops",
    "rotations",
    "timing",
]


def env_info() -> dict[str, str]:
    """GPU, driver, versions and date, written beside every number."""
    props = torch.cuda.get_device_properties(0)
    try:
        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    return {
        "gpu": props.name,
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "sms": str(props.multi_processor_count),
        "l2_mb": f"{getattr(props, 'L2_cache_size', 60 * 2**20) / 2**20:.0f}",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def copy_bandwidth(nbytes: int = 4 * 2**30) -> float:
    """Device-to-device copy rate in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * nbytes / time_calls([lambda: dst.copy_(src)], use_graph=False).median_s


def rotations(bytes_per_input: int, l2_bytes: int, cap: int = 32) -> int:
    """Input sets to cycle through so that one pass touches over 3x the L2."""
    return max(1, min(cap, math.ceil(3 * l2_bytes / max(1, bytes_per_input))))


def sdpa_calls(q, k, v, causal: bool, backend_name: str):
    """Callables running SDPA with one backend, with GQA mode 'native' or 'repeat'."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[
        backend_name
    ]
    gqa = q[0].shape[1] != k[0].shape[1]

    def make(qi, ki, vi, enable_gqa):
        def call():
            with sdpa_kernel(backend):
                return sdpa(qi, ki, vi, is_causal=causal, enable_gqa=enable_gqa)

        return call

    calls = [make(qi, ki, vi, gqa) for qi, ki, vi in zip(q, k, v, strict=True)]
    try:
        calls[0]()
        torch.cuda.synchronize()
        return calls, "native" if gqa else "-"
    except RuntimeError:
        if not gqa:
            raise
    group = q[0].shape[1] // k[0].shape[1]
    k = [ki.repeat_interleave(group, 1) for ki in k]
    v = [vi.repeat_interleave(group, 1) for vi in v]
    calls = [make(qi, ki, vi, False) for qi, ki, vi in zip(q, k, v, strict=True)]
    calls[0]()
    return calls, "repeat"


def time_sdpa(q, k, v, causal, row, emit):
    for name in ("cudnn", "flash"):
        try:
            calls, gqa = sdpa_calls(q, k, v, causal, name)
            t = time_calls(calls)
            emit(
                row
                | {
                    "impl": f"sdpa_{name}",
                    "gqa": gqa,
                    "time_us": t.median_s * 1e6,
                    "spread_us": (t.max_s - t.min_s) * 1e6,
                    "timing": t.method,
                }
            )
        except RuntimeError as e:  # backend refuses this shape/dtype: say so, go on
            print(f"  sdpa_{name} unavailable: {str(e).splitlines()[0][:120]}", flush=True)


def bench_decode(model, dtype_name, batch, ctx, env, copy_bw, emit, alt_config=None):
    """SDPA rows, then the paged kernel per block size (and `alt_config`, if given)."""
    heads, kv_heads, d = MODELS[model]
    dtype = DTYPES[dtype_name]
    l2 = int(float(env["l2_mb"]) * 2**20)
    elem = torch.finfo(dtype).bits // 8
    kv_bytes = 2 * batch * ctx * kv_heads * d * elem
    base = dict(
        kind="decode", model=model, dtype=dtype_name, batch=batch, context=ctx, kv_bytes=kv_bytes
    )

    def finish(row):  # bandwidth columns from the time
        t = row["time_us"] * 1e-6
        return row | {"kv_gbps": kv_bytes / t / 1e9, "pct_copy_bw": 100 * kv_bytes / t / copy_bw}

    # SDPA on contiguous K/V [B, S, Hkv, D] viewed as [B, Hkv, S, D].
    n_rot = rotations(kv_bytes, l2)
    q = [torch.randn(batch, heads, 1, d, dtype=dtype, device="cuda") for _ in range(n_rot)]
    k = [
        torch.randn(batch, ctx, kv_heads, d, dtype=dtype, device="cuda").transpose(1, 2)
        for _ in range(n_rot)
    ]
    v = [torch.randn_like(ki) for ki in k]
    time_sdpa(
        q, k, v, False, base | {"block_size": "", "rotations": n_rot}, lambda r: emit(finish(r))
    )
    del q, k, v

    for bs in BLOCK_SIZES:
        for name, cfg in (("triton", None), ("alt", alt_config)):
            if name == "alt" and cfg is None:
                continue
            t, part = time_paged_decode(model, dtype, batch, ctx, bs, n_rot, int(env["sms"]), cfg)
            emit(
                finish(
                    base
                    | {
                        "block_size": bs,
                        "impl": f"{name}_p{part.num_partitions}",
                        "gqa": "group",
                        "time_us": t.median_s * 1e6,
                        "spread_us": (t.max_s - t.min_s) * 1e6,
                        "rotations": n_rot,
                        "timing": t.method,
                    }
                )
            )
            torch.cuda.empty_cache()


def paged_cache(n_rot, batch, ctx, bs, kv_heads, d, dtype):
    """K/V caches holding `n_rot` batches of contexts, and their permuted block tables."""
    per_seq = ctx // bs
    num_blocks = 1 + n_rot * batch * per_seq  # block 0 is the null block
    kc = torch.randn(num_blocks, bs, kv_heads, d, dtype=dtype, device="cuda")
    vc = torch.randn_like(kc)
    perm = torch.randperm(num_blocks - 1, device="cuda") + 1
    return kc, vc, perm.view(n_rot, batch, per_seq).to(torch.int32)


def time_paged_decode(model, dtype, batch, ctx, bs, n_rot, sms, config=None):
    heads, kv_heads, d = MODELS[model]
    kc, vc, tables = paged_cache(n_rot, batch, ctx, bs, kv_heads, d, dtype)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    qs = torch.randn(n_rot, batch, heads, d, dtype=dtype, device="cuda")
    outs = torch.empty_like(qs)
    cfg = config or decode_config(d, heads // kv_heads, True)
    part = decode_partition(batch, kv_heads, ctx, cfg, sms)
    ws = (
        DecodeWorkspace.allocate(batch, heads, d, part.num_partitions, "cuda")
        if part.num_partitions > 1
        else None
    )
    calls = [
        lambda r=r: paged_attention_decode(
            qs[r], kc, vc, tables[r], seq_lens, part, out=outs[r], workspace=ws, config=cfg
        )
        for r in range(n_rot)
    ]
    return time_calls(calls), part


def time_paged_prefill(model, dtype, qf, batch, ctx, bs):
    heads, kv_heads, d = MODELS[model]
    tokens = batch * ctx
    kc, vc, tables = paged_cache(len(qf), batch, ctx, bs, kv_heads, d, dtype)
    qsl = torch.arange(0, tokens + 1, ctx, dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    out = torch.empty_like(qf[0])
    calls = [
        lambda r=r: paged_attention_prefill(qf[r], kc, vc, tables[r], seq_lens, qsl, out=out)
        for r in range(len(qf))
    ]
    return time_calls(calls)


def bench_prefill(model, dtype_name, batch, ctx, env, emit):
    heads, kv_heads, d = MODELS[model]
    dtype = DTYPES[dtype_name]
    l2 = int(float(env["l2_mb"]) * 2**20)
    elem = torch.finfo(dtype).bits // 8
    tokens = batch * ctx
    flops = 4 * batch * heads * d * ctx * (ctx + 1) / 2  # causal QK^T and PV
    io_bytes = tokens * (2 * heads + 2 * kv_heads) * d * elem
    n_rot = rotations(io_bytes, l2, cap=8)
    base = dict(
        kind="prefill", model=model, dtype=dtype_name, batch=batch, context=ctx, rotations=n_rot
    )

    def finish(row):
        return row | {"tflops": flops / (row["time_us"] * 1e-6) / 1e12}

    q = [torch.randn(batch, ctx, heads, d, dtype=dtype, device="cuda") for _ in range(n_rot)]
    k = [torch.randn(batch, ctx, kv_heads, d, dtype=dtype, device="cuda") for _ in range(n_rot)]
    v = [torch.randn_like(ki) for ki in k]
    time_sdpa(
        [x.transpose(1, 2) for x in q],
        [x.transpose(1, 2) for x in k],
        [x.transpose(1, 2) for x in v],
        True,
        base | {"block_size": ""},
        lambda r: emit(finish(r)),
    )
    del k, v
    torch.cuda.empty_cache()
    qf = [x.view(tokens, heads, d) for x in q]
    for bs in BLOCK_SIZES:
        t = time_paged_prefill(model, dtype, qf, batch, ctx, bs)
        emit(
            finish(
                base
                | {
                    "block_size": bs,
                    "impl": "triton",
                    "gqa": "group",
                    "time_us": t.median_s * 1e6,
                    "timing": t.method,
                    "spread_us": (t.max_s - t.min_s) * 1e6,
                }
            )
        )
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results")
    ap.add_argument("--name", default="attention_h200")
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--sweep", action="store_true", help="also sweep kernel configs")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--sweep-only", action="store_true", help="only the config sweep")
    ap.add_argument("--sweep-set", default="splits", help="splits or short")
    ap.add_argument(
        "--decode-alt", default="", help="also time decode with tile_n,warps,stages,programs_per_sm"
    )
    args = ap.parse_args()
    # `timeout` sends SIGTERM: exit through the finally below so the tables still get written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))
    os.makedirs(args.out, exist_ok=True)
    env = env_info()
    copy_bw = copy_bandwidth()
    env["copy_gbps"] = f"{copy_bw / 1e9:.0f}"
    print(" | ".join(f"{k}={v}" for k, v in env.items()), flush=True)
    if not args.sweep_only:
        run_grid(args, env, copy_bw)
    if args.sweep or args.sweep_only:
        from benchmarks.attention_sweep import run_sweep

        run_sweep(
            env,
            copy_bw,
            os.path.join(args.out, f"{args.name}_sweep_{args.sweep_set}.csv"),
            args.sweep_set,
        )


def run_grid(args, env, copy_bw) -> None:
    """Every decode and prefill shape; CSV rows as they come, markdown at the end."""
    from benchmarks.attention_report import write_markdown

    rows: list[dict] = []
    md_path = os.path.join(args.out, f"{args.name}.md")
    with open(os.path.join(args.out, f"{args.name}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()

        def emit(row):
            row = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
            rows.append(row)
            writer.writerow(row)
            f.flush()
            print("  " + " ".join(f"{k}={row.get(k, '')}" for k in FIELDS[:12]), flush=True)

        batches, contexts = ((1, 32), (512, 8192)) if args.quick else (BATCHES, CONTEXTS)
        alt = None
        if args.decode_alt:
            tile, warps, stages, per_sm = (int(x) for x in args.decode_alt.split(","))
            alt = KernelConfig(16, tile, warps, stages, per_sm)
        try:
            for model in MODELS:
                for dtype_name in DTYPES:
                    for batch in batches:
                        for ctx in contexts:
                            bench_decode(model, dtype_name, batch, ctx, env, copy_bw, emit, alt)
            if not args.skip_prefill:
                for model in MODELS:
                    for dtype_name in DTYPES:
                        for batch in batches:
                            for ctx in contexts:
                                if batch * ctx <= PREFILL_MAX_TOKENS:
                                    bench_prefill(model, dtype_name, batch, ctx, env, emit)
        finally:
            write_markdown(rows, env, md_path)
            print(open(md_path).read(), flush=True)


if __name__ == "__main__":
    main()
