"""Decode steps of one mean context and different spreads of context lengths (GPU).

The cost model prices a decode step at its mean context, from calibration rows where every
sequence has the same context. This times, in interleaved rounds in one runner, decode graph
steps of B sequences whose contexts have one mean but are spread over [mean - w, mean + w]
(evenly, a seeded shuffle), against the step with every context at the mean: the ratio says
what the spread costs at each batch size, and with it the decode kernel's partitions (chosen
from the longest context's span bucket).

    PYTHONPATH=. python3 benchmarks/decode_spread.py --models llama-2-7b,llama-3-8b --out $OUT

Prints a table; writes decode_spread.csv under --out.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--batches", default="4,8,16,24,32,64")
    ap.add_argument("--mean", type=int, default=1800)
    ap.add_argument("--half-widths", default="0,600,1200,1700")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import torch
    from shared_groups import grouped_step

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import (
        BlockSource,
        CalibrationGrid,
        measure_interleaved,
        spread_contexts,
    )
    from pagesim.gpu.device import device_info
    from pagesim.gpu.memory import MemorySnapshot, measure_kv_capacity
    from pagesim.gpu.model import RandomWeightDecoder
    from pagesim.gpu.runner import GPUModelRunner

    info = device_info(torch.device("cuda"))
    rows = []
    for name in args.models.split(","):
        t0 = time.monotonic()
        config = EngineConfig.create(model=name, gpu="h200", block_size=16)
        before = MemorySnapshot.take(torch.device("cuda"))
        model = RandomWeightDecoder(config.model_spec, torch.bfloat16, "cuda", 16, 0)
        blocks = measure_kv_capacity(config, model, before, (16,)).num_gpu_blocks[16]
        runner = GPUModelRunner(config, blocks, device="cuda", model=model)
        runner.record_steps = False
        items, meta = [], []
        for b in map(int, args.batches.split(",")):
            for k, w in enumerate(map(int, args.half_widths.split(","))):
                ctx = spread_contexts(b, args.mean, w, seed=k)
                out = grouped_step(ctx, [-1] * b, {}, 16, BlockSource(blocks, k))
                key = runner.graphs.key_for(out.scheduled) if runner.graphs else None
                items.append((out, False))
                meta.append((b, w, ctx, key))
        timings = measure_interleaved(runner, items, CalibrationGrid(
            repeats=args.rounds, min_repeats=args.rounds))
        uniform = {b: t.median for (b, w, _, _), t in zip(meta, timings, strict=True) if w == 0}
        for (b, w, ctx, key), t in zip(meta, timings, strict=True):
            row = {"model": name, "batch": b, "mean_context": round(sum(ctx) / b),
                   "longest_context": max(ctx), "half_width": w,
                   "graph_size": key.size if key else "", "num_partitions":
                   key.num_partitions if key else "", "step_time_ms": t.median * 1e3,
                   "uniform_step_time_ms": uniform[b] * 1e3, "ratio": t.median / uniform[b],
                   "gpu": info["gpu_name"], "driver": info.get("driver", ""),
                   "torch": info["torch"], "triton": info["triton"], "date": info["date"]}
            rows.append(row)
            print(f"{name} b={b:>3} contexts {args.mean}+-{w:<5} longest {max(ctx):>5} "
                  f"partitions {row['num_partitions']}: {t.median * 1e3:.2f} ms, "
                  f"{row['ratio']:.3f} of uniform", flush=True)
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        del runner, model
        torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "decode_spread.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
