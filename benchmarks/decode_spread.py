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
import time


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
    from gpu_bench import device_columns, release, served_runner, write_rows
    from shared_groups import grouped_step

    from pagesim.gpu.calibrate import (
        BlockSource,
        CalibrationGrid,
        measure_interleaved,
        spread_contexts,
    )
    from pagesim.gpu.device import device_info

    info = device_info(torch.device("cuda"))
    rows = []
    for name in args.models.split(","):
        t0 = time.monotonic()
        _, runner = served_runner(name)
        blocks = runner.num_gpu_blocks
        runner.record_steps = False
        items, meta = [], []
        for b in map(int, args.batches.split(",")):
            for k, w in enumerate(map(int, args.half_widths.split(","))):
                ctx = spread_contexts(b, args.mean, w, seed=k)
                out = grouped_step(ctx, [-1] * b, {}, 16, BlockSource(blocks, k))
                key = runner.graphs.key_for(out.scheduled) if runner.graphs else None
                items.append((out, False))
                meta.append((b, w, ctx, key))
        timings = measure_interleaved(
            runner, items, CalibrationGrid(repeats=args.rounds, min_repeats=args.rounds)
        )
        uniform = {b: t.median for (b, w, _, _), t in zip(meta, timings, strict=True) if w == 0}
        for (b, w, ctx, key), t in zip(meta, timings, strict=True):
            row = {
                "model": name,
                "batch": b,
                "mean_context": round(sum(ctx) / b),
                "longest_context": max(ctx),
                "half_width": w,
                "graph_size": key.size if key else "",
                "num_partitions": key.num_partitions if key else "",
                "step_time_ms": t.median * 1e3,
                "uniform_step_time_ms": uniform[b] * 1e3,
                "ratio": t.median / uniform[b],
                **device_columns(info),
            }
            rows.append(row)
            print(
                f"{name} b={b:>3} contexts {args.mean}+-{w:<5} longest {max(ctx):>5} "
                f"partitions {row['num_partitions']}: {t.median * 1e3:.2f} ms, "
                f"{row['ratio']:.3f} of uniform",
                flush=True,
            )
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        release(runner)
    write_rows(args.out, "decode_spread.csv", rows)


if __name__ == "__main__":
    main()
