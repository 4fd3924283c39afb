"""Decode steps over scattered vs consecutive KV blocks, timed in one runner (GPU).

The calibration hands every grid point a seeded permutation of the cache's blocks, as a
long-running server's tables are; a fresh server's free queue hands out consecutive blocks.
This times the same decode steps both ways, interleaved (`measure_interleaved`), on the full
KV cache a server of this model would have (`gpu_memory_utilization` 0.92). `--heavy N` adds N
prefill steps of 8,192 tokens (the model's limit if lower) to every round, as the calibration's mixed rounds have, to see what
heavy neighbours do to light steps' times.

    PYTHONPATH=. python3 benchmarks/block_order.py --models llama-3-8b,llama-2-7b --out $OUT

Prints a table; writes block_order.csv under --out.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-3-8b,llama-2-7b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--batches", default="1,4,16,32,64")
    ap.add_argument("--contexts", default="1024,2048,4096")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--heavy",
        type=int,
        default=0,
        help="also interleave this many long prefill steps per round, as "
        "the calibration's rounds do (scattered blocks only)",
    )
    args = ap.parse_args()
    import torch
    from gpu_bench import device_columns, release, served_runner, write_rows

    from pagesim.gpu.calibrate import (
        BlockSource,
        CalibrationGrid,
        measure_interleaved,
        synthetic_step,
    )
    from pagesim.gpu.device import device_info

    info = device_info(torch.device("cuda"))
    rows = []
    for name in args.models.split(","):
        config, runner = served_runner(name)
        blocks = runner.num_gpu_blocks
        items, keys = [], []
        for b in map(int, args.batches.split(",")):
            for c in sorted(
                {min(int(x), config.max_model_len - 1) for x in args.contexts.split(",")}
            ):
                for scattered in (True, False):
                    out = synthetic_step([(c, 1)] * b, 16, BlockSource(blocks, 0, scattered))
                    if out is not None:
                        items.append((out, False))
                        keys.append((b, c, scattered))
        heavy = min(8192, config.max_num_batched_tokens, config.max_model_len)
        for k in range(args.heavy):
            out = synthetic_step([(0, heavy)], 16, BlockSource(blocks, k + 1))
            items.append((out, False))
            keys.append(("heavy", k, True))
        grid = CalibrationGrid(repeats=args.repeats, min_repeats=args.repeats)
        t0 = time.monotonic()
        timings = measure_interleaved(runner, items, grid)
        got = {k: t.median * 1e3 for k, t in zip(keys, timings, strict=True)}
        for (b, c, scattered), ms in got.items():
            if b == "heavy":
                continue
            if scattered and (b, c, False) in got:
                rows.append(
                    {
                        "model": name,
                        "heavy_per_round": args.heavy,
                        "batch": b,
                        "context": c,
                        "scattered_ms": ms,
                        "consecutive_ms": got[(b, c, False)],
                        "ratio": got[(b, c, False)] / ms,
                        "num_gpu_blocks": blocks,
                        **device_columns(info),
                    }
                )
                print(
                    f"{name} b={b} c={c}: scattered {ms:.2f} ms, consecutive "
                    f"{got[(b, c, False)]:.2f} ms, ratio {rows[-1]['ratio']:.3f}",
                    flush=True,
                )
        print(
            f"{name}: {len(items)} steps x {args.repeats} rounds in {time.monotonic() - t0:.0f} s",
            flush=True,
        )
        release(runner)
    write_rows(
        args.out,
        "block_order.csv" if not args.heavy else f"block_order_heavy{args.heavy}.csv",
        rows,
    )


if __name__ == "__main__":
    main()
