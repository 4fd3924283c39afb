"""Mixed steps whose decodes have unequal contexts, against their uniform twins (GPU).

A step with a prefill entry runs the variable-length attention kernel over every sequence, a
decode being one program per KV head over its whole context. The kernel's grid hands out every
program of head 0, then head 1's, ...; so a long decode of the last head starts after the
other heads' work. This times, in interleaved rounds in one runner (block 16):

    spread    d decodes whose contexts average C, spread evenly over C +- 0.9 C, plus one
              prefill entry of q new tokens (q <= 512 - d: a mixed CUDA graph; larger: eager)
    uniform   its twin: every context C (the same work per head, a shorter longest program)

The ratio of the two is what the cost model's schedule of the kernel's programs must
predict, whatever the call's clocks (`benchmarks/varlen_spread_report.py` compares them).

    PYTHONPATH=. python3 benchmarks/varlen_spread.py --models llama-2-7b,llama-3-8b --out $OUT

Prints a table; writes varlen_spread.csv under --out.
"""

from __future__ import annotations

import argparse
import time

#: (decodes, mean context, new tokens of the prefill entry)
SHAPES = tuple((d, c, q) for d in (16, 32, 64) for c in (1024, 2048) for q in (16, 128, 1024))


def contexts(d: int, c: int, spread: bool) -> list[int]:
    """The step's decode contexts: evenly over c +- 0.9 c in a seeded order, or all c."""
    from pagesim.gpu.calibrate import spread_contexts

    return spread_contexts(d, c, int(0.9 * c), seed=d * 7919 + c) if spread else [c] * d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--rounds", type=int, default=7)
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
        t0 = time.monotonic()
        _, runner = served_runner(name)
        runner.record_steps = False
        items = []
        for k, (d, c, q) in enumerate(SHAPES):
            for spread in (True, False):
                spec = [(x, 1) for x in contexts(d, c, spread)] + [(0, q)]
                items.append(
                    (synthetic_step(spec, 16, BlockSource(runner.num_gpu_blocks, k)), False)
                )
        timings = measure_interleaved(
            runner, items, CalibrationGrid(repeats=args.rounds, min_repeats=args.rounds)
        )
        for k, (d, c, q) in enumerate(SHAPES):
            t, ref = timings[2 * k].median * 1e3, timings[2 * k + 1].median * 1e3
            rows.append(
                {
                    "model": name,
                    "decodes": d,
                    "mean_context": c,
                    "new_tokens": q,
                    "step_time_ms": t,
                    "uniform_step_time_ms": ref,
                    "ratio": t / ref,
                    **device_columns(info),
                }
            )
            print(
                f"{name} d={d} c={c} q={q}: spread {t:.2f} ms, uniform {ref:.2f} ms, "
                f"ratio {t / ref:.3f}",
                flush=True,
            )
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        release(runner)
    write_rows(args.out, "varlen_spread.csv", rows)


if __name__ == "__main__":
    main()
