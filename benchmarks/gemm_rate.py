"""The dense GEMM rate a GPU reaches on one model's layer GEMMs, per token count.

    python benchmarks/gemm_rate.py --model llama-2-7b --out DIR      # on a CUDA GPU
    python benchmarks/gemm_rate.py --model tiny-llama --out DIR --cpu  # a smoke test

Times `torch.nn.functional.linear` (cuBLAS, bf16) for the projections of one decoder layer
(fused qkv, o, fused gate/up, down) and one large square GEMM, at token counts 1 to 4096,
with CUDA events (warm-up, then the median of `--reps` timings), and prints each GEMM's
time, its FLOP/s and its share of the GPU's datasheet dense rate. The large square GEMM is
the card's achievable tensor rate; the layer GEMMs at many tokens say whether pagesim's runner
(which calls the same `linear`) reaches it. Writes `gemm_rate.csv` in `--out`.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

TOKENS = (1, 16, 64, 256, 1024, 2048, 4096)


def layer_gemms(model: str) -> list[tuple[str, int, int]]:
    """(name, in features, out features) of one decoder layer's projections."""
    from pagesim.specs import MODELS

    m = MODELS[model]
    d, h = m.hidden_size, m.head_size
    qkv = (m.num_attention_heads + 2 * m.num_kv_heads) * h
    return [
        ("qkv", d, qkv),
        ("o", m.num_attention_heads * h, d),
        ("gate_up", d, 2 * m.intermediate_size),
        ("down", m.intermediate_size, d),
    ]


def time_linear(x, w, reps: int, cuda: bool) -> float:
    """Median seconds of one `linear(x, w)`."""
    import torch
    import torch.nn.functional as F

    for _ in range(3):
        F.linear(x, w)
    samples = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            F.linear(x, w)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            F.linear(x, w)
            samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-2-7b")
    ap.add_argument("--gpu", default="h200", help="GPU spec whose datasheet rate is the 100 %")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cpu", action="store_true", help="fp32 on the CPU, small sizes (smoke)")
    args = ap.parse_args()
    import torch

    from pagesim.specs import GPUS

    cuda = not args.cpu
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    peak = GPUS[args.gpu].fp16_flops
    shapes = layer_gemms(args.model)
    square = 8192 if cuda else 256
    shapes.append((f"square{square}", square, square))
    tokens = TOKENS if cuda else (1, 16, 64)
    rows = []
    for name, k, n in shapes:
        w = torch.randn(n, k, device=device, dtype=dtype) * 0.02
        for t in tokens if not name.startswith("square") else (square,):
            x = torch.randn(t, k, device=device, dtype=dtype)
            s = time_linear(x, w, args.reps, cuda)
            flops = 2.0 * t * k * n
            rows.append(
                {
                    "gemm": name,
                    "tokens": t,
                    "k": k,
                    "n": n,
                    "time_ms": round(s * 1e3, 5),
                    "tflops": round(flops / s / 1e12, 2),
                    "share_of_datasheet": round(flops / s / peak, 4),
                }
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "gemm_rate.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.model} GEMMs on {torch.cuda.get_device_name() if cuda else 'cpu'}")
    print(f"{'gemm':>12} {'tokens':>6} {'ms':>9} {'TFLOP/s':>8} {'of datasheet':>12}")
    for r in rows:
        print(
            f"{r['gemm']:>12} {r['tokens']:>6} {r['time_ms']:>9.4f} {r['tflops']:>8.1f}"
            f" {100 * r['share_of_datasheet']:>11.1f}%"
        )


if __name__ == "__main__":
    main()
