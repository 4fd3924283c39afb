"""A heavy step's time after light steps and after heavy ones: the GPU's clock state (GPU).

A served run at 50-95 % load runs mostly light decode-graph steps, and each prompt's prefill
comes as one heavy eager step among them; at rate inf the heavy steps come back to back, and
the calibration's interleaved rounds mix every kind of step. On the stored H200 runs, eager
prefill steps of 3,000-9,000 tokens are priced about 3 % slow in the Poisson runs and within
1 % in the rate-inf runs, with the same profile; the SM clock sampled during them averaged
1,903-1,930 MHz against 1,853-1,872 MHz (`results/validation/README.md`).

This times one heavy step (a prefill, eager) in one runner after each context, in rounds that
take the contexts in a seeded random order:

    after 3 heavy    three untimed heavy steps first (a burst, as at rate inf)
    after 1 heavy
    after N light    N decode-graph steps (32 sequences x 1,024 tokens) first, N = 1-100
    after N small    N decode-graph steps of 4 sequences x 1,024 tokens first (a lighter load,
                     as at 50 % of capacity), N = 30, 100

with the SM clock read just before the timed step.

    PYTHONPATH=. python3 benchmarks/heavy_after_light.py --models llama-2-7b,llama-3-8b --out $OUT

Prints a table; writes heavy_after_light.csv under --out. `--dry-run-cpu` runs the tiny model
under the Triton interpreter with small steps, to test this script without a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

CONTEXTS = (
    ("after 3 heavy", "heavy", 3),
    ("after 1 heavy", "heavy", 1),
    ("after 1 light", "light", 1),
    ("after 3 light", "light", 3),
    ("after 10 light", "light", 10),
    ("after 30 light", "light", 30),
    ("after 100 light", "light", 100),
    ("after 30 small light", "small", 30),
    ("after 100 small light", "small", 100),
)


def timed(runner, step) -> float:
    """Seconds of one step on the host clock (the call ends with a device sync)."""
    t = time.perf_counter()
    runner.execute_model(step)
    return time.perf_counter() - t


def clock_mhz() -> int:
    import torch

    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # no NVML, or no GPU
        return 0


def in_calibration_rounds(
    name: str, runner, config, heavy_tokens: list[int], rows: list, dry: bool, info: dict
) -> list[dict]:
    """The heavy steps' prefill rows as `calibrate_block_size` times them (block 16, the
    default grid, 3 rounds), against this runner's burst time of the same step."""
    from gpu_bench import device_columns

    from pagesim.gpu.calibrate import CalibrationGrid, calibrate_block_size

    grid = CalibrationGrid(repeats=3, min_repeats=3)
    if dry:
        grid = CalibrationGrid(
            decode_batches=(1, 2),
            decode_contexts=(16,),
            prefill_tokens=tuple(heavy_tokens),
            prefill_cached=(0,),
            mixed=(),
            multi_prefill=(),
            decode_shared=(),
            varlen_shared=(),
            decode_spread=(),
            decode_shared_spread=(),
            repeats=2,
            min_repeats=2,
        )
    got = calibrate_block_size(
        runner,
        16,
        grid,
        max_model_len=config.max_model_len,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        full=True,
    )
    out = []
    for r in got.prefill:
        if r.num_cached_tokens or r.num_new_tokens not in heavy_tokens:
            continue
        burst = next(
            x["heavy_ms"]
            for x in rows
            if x["model"] == name
            and x["heavy_tokens"] == r.num_new_tokens
            and x["context"] == "after 3 heavy"
        )
        out.append(
            {
                "model": name,
                "heavy_tokens": r.num_new_tokens,
                "context": "calibration rounds",
                "rounds": 3,
                "heavy_ms": r.step_time_ms,
                "ratio_to_burst": r.step_time_ms / burst,
                "clock_mhz": 0,
                **device_columns(info),
            }
        )
        print(
            f"{name} prefill {r.num_new_tokens}: calibration rounds "
            f"{r.step_time_ms:8.2f} ms  x{r.step_time_ms / burst:.3f}",
            flush=True,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--heavy-tokens", default="4096,1024")
    ap.add_argument(
        "--calibration-rounds",
        action="store_true",
        help="also time the heavy steps as the calibration does, in interleaved "
        "rounds of block 16's whole grid (3 rounds), in the same runner",
    )
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch
    from gpu_bench import device_columns, dry_runner, release, served_runner, write_rows

    from pagesim.gpu.calibrate import BlockSource, synthetic_step
    from pagesim.gpu.device import device_info

    dry = args.dry_run_cpu
    info = device_info(None if dry else torch.device("cuda"))
    rows = []
    for name in args.models.split(","):
        t0 = time.monotonic()
        if dry:
            config, runner = dry_runner(64, max_num_batched_tokens=64, max_model_len=256)
            light_spec, small_spec, heavy_tokens = [(24, 1)] * 2, [(24, 1)], [32]
        else:
            config, runner = served_runner(name)
            light_spec, small_spec = [(1024, 1)] * 32, [(1024, 1)] * 4
            heavy_tokens = [int(x) for x in args.heavy_tokens.split(",")]
        blocks = runner.num_gpu_blocks
        runner.record_steps = False
        light = synthetic_step(light_spec, 16, BlockSource(blocks, 1))
        small = synthetic_step(small_spec, 16, BlockSource(blocks, 3))
        rng = np.random.default_rng(0)
        for tokens in heavy_tokens:
            heavy = synthetic_step([(0, tokens)], 16, BlockSource(blocks, 2))
            before = {"heavy": heavy, "light": light, "small": small}
            for out in (light, small, heavy, light, small, heavy):  # warm-up: compiles, graphs
                runner.execute_model(out)
            times: dict[str, list[float]] = {label: [] for label, _, _ in CONTEXTS}
            clocks: dict[str, list[int]] = {label: [] for label, _, _ in CONTEXTS}
            for _ in range(args.rounds):
                for i in rng.permutation(len(CONTEXTS)).tolist():
                    label, kind, count = CONTEXTS[i]
                    for _ in range(min(count, 2) if dry else count):
                        runner.execute_model(before[kind])
                    clocks[label].append(clock_mhz())  # the clock the heavy step starts at
                    times[label].append(timed(runner, heavy))
            base = statistics.median(times["after 3 heavy"])
            for label, _, _ in CONTEXTS:
                ms = statistics.median(times[label]) * 1e3
                row = {
                    "model": name,
                    "heavy_tokens": tokens,
                    "context": label,
                    "rounds": len(times[label]),
                    "heavy_ms": ms,
                    "ratio_to_burst": ms / (base * 1e3),
                    "clock_mhz": statistics.median(clocks[label]) if clocks[label] else 0,
                    **device_columns(info),
                }
                rows.append(row)
                print(
                    f"{name} prefill {tokens}: {label:21s} {ms:8.2f} ms  "
                    f"x{row['ratio_to_burst']:.3f}  clock {row['clock_mhz']} MHz",
                    flush=True,
                )
        if args.calibration_rounds:
            rows += in_calibration_rounds(name, runner, config, heavy_tokens, rows, dry, info)
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        if not dry:
            release(runner)
    write_rows(args.out, "heavy_after_light.csv", rows)


if __name__ == "__main__":
    main()
