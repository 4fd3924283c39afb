"""The same decode step timed inside a served run and the way the calibration times it (GPU).

A decode ramp (R requests arriving together, one prompt length, output lengths staggered by
`--stride`) is served through `Scheduler` + `GPUModelRunner` in wall-clock time, as
`pagesim validate` serves its runs. Every request decodes from the same step on, so every
decode step of the ramp has one context for all its sequences, as a calibration row has.
Then synthetic steps of exactly those shapes (batch, context) are timed three ways in the
same runner, same KV cache:

    interleaved   `measure_interleaved`: every shape once per round, shuffled (the
                  calibration's method), with the attention-skipped twins in the rounds
    consecutive   each shape called back to back `--repeats` times (a running batch's steps
                  come back to back)
    gap           consecutive, with `--gap-ms` of host busy time between calls (the
                  scheduler's time between a served run's steps)

Per shape and way: the median of the host wall time of `execute_model`, and of its parts
(host preparation; device forward from CUDA events).

    PYTHONPATH=. python3 benchmarks/decode_in_run.py --models llama-3-8b,llama-2-7b --out $OUT

Prints a table; writes decode_in_run.csv under --out.
"""

from __future__ import annotations

import argparse
import statistics
import time


def ramp_requests(n: int, prompt_len: int, stride: int, vocab: int):
    from pagesim.request import Request

    out = []
    for i in range(n):
        prompt = [(i * 7919 + j * 104_729 + prompt_len) % vocab for j in range(prompt_len)]
        out.append(
            Request(
                f"ramp-{prompt_len}-{i}", prompt, max_tokens=stride * (i + 1) + 1, arrival_time=0.0
            )
        )
    return out


def in_run_steps(runner, config, n: int, prompt_len: int, stride: int) -> dict:
    """(batch, mean context) -> per-step (wall, prepare, forward) of the ramp's decode steps."""
    from pagesim.gpu.serve import make_engine, replay

    scheduler = make_engine(config, runner.num_gpu_blocks)
    first = len(runner.step_records)
    replay(ramp_requests(n, prompt_len, stride, config.model_spec.vocab_size), scheduler, runner)
    by: dict[int, list] = {}
    for r in runner.step_records[first:]:
        if r.num_prefill_tokens or not r.num_reqs or (runner.graphs and not r.cuda_graph):
            continue
        by.setdefault(r.num_reqs, []).append(
            (r.context_sum / r.num_reqs, r.wall_s, r.prepare_s, r.forward_s)
        )
    return by


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def consecutive(runner, out, repeats: int, gap_s: float) -> list[tuple[float, float, float]]:
    for _ in range(2):
        runner.execute_model(out)
    got = []
    for _ in range(repeats):
        if gap_s:
            busy_wait(gap_s)
        t = time.perf_counter()
        b = runner.execute_model(out).time_breakdown_s
        got.append((time.perf_counter() - t, b["prepare"], b.get("forward", 0.0)))
    return got


def med(xs) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-3-8b,llama-2-7b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--batches", default="1,2,4,8,16,24,32,48,64")
    ap.add_argument("--prompts", default="128,1024")
    ap.add_argument("--stride", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--gap-ms", type=float, default=0.3)
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="tiny model on the CPU (Triton interpreter): tests this script",
    )
    args = ap.parse_args()
    import gc

    import torch
    from gpu_bench import device_columns, dry_runner, served_runner, write_rows

    from pagesim.gpu.calibrate import (
        BlockSource,
        CalibrationGrid,
        measure_interleaved,
        synthetic_step,
    )
    from pagesim.gpu.device import device_info

    dry = args.dry_run_cpu
    info = device_info(None if dry else torch.device("cuda"))
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for name in args.models.split(","):
        t0 = time.monotonic()
        if dry:
            config, runner = dry_runner(256, max_num_batched_tokens=256, max_model_len=512)
        else:
            config, runner = served_runner(name)
        blocks = runner.num_gpu_blocks
        if runner.graphs is not None:
            runner.graphs.capture_all(max(batches))
        for prompt_len in map(int, args.prompts.split(",")):
            ramp = in_run_steps(runner, config, max(batches), prompt_len, args.stride)
            shapes = [
                (b, round(statistics.mean(c for c, *_ in ramp[b]))) for b in batches if b in ramp
            ]
            steps = {
                s: synthetic_step([(s[1], 1)] * s[0], 16, BlockSource(blocks, 0)) for s in shapes
            }
            items = [(steps[s], skip) for s in shapes for skip in (False, True)]
            runner.record_steps = False
            timings = measure_interleaved(runner, items, CalibrationGrid(repeats=7, min_repeats=7))
            gc.disable()
            cons = {s: consecutive(runner, steps[s], args.repeats, 0.0) for s in shapes}
            gap = {
                s: consecutive(runner, steps[s], args.repeats, args.gap_ms / 1e3) for s in shapes
            }
            gc.enable()
            runner.record_steps = True
            for k, s in enumerate(shapes):
                ir = ramp[s[0]]
                row = {
                    "model": name,
                    "prompt_len": prompt_len,
                    "batch": s[0],
                    "context": s[1],
                    "in_run_steps": len(ir),
                    "in_run_ms": med([x[1] for x in ir]),
                    "in_run_prepare_ms": med([x[2] for x in ir]),
                    "in_run_forward_ms": med([x[3] for x in ir]),
                    "interleaved_ms": timings[2 * k].median * 1e3,
                    "interleaved_other_ms": timings[2 * k + 1].median * 1e3,
                    "consecutive_ms": med([x[0] for x in cons[s]]),
                    "consecutive_prepare_ms": med([x[1] for x in cons[s]]),
                    "consecutive_forward_ms": med([x[2] for x in cons[s]]),
                    "gap_ms": med([x[0] for x in gap[s]]),
                    "gap_forward_ms": med([x[2] for x in gap[s]]),
                    **device_columns(info),
                }
                rows.append(row)
                print(
                    f"{name} P={prompt_len} b={s[0]:>3} c={s[1]:>5}: in-run "
                    f"{row['in_run_ms']:.2f} (prep {row['in_run_prepare_ms']:.2f} fwd "
                    f"{row['in_run_forward_ms']:.2f}) | interleaved "
                    f"{row['interleaved_ms']:.2f} | consecutive {row['consecutive_ms']:.2f} "
                    f"(prep {row['consecutive_prepare_ms']:.2f} fwd "
                    f"{row['consecutive_forward_ms']:.2f}) | gap {row['gap_ms']:.2f} "
                    f"(fwd {row['gap_forward_ms']:.2f})",
                    flush=True,
                )
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        del runner
        if not dry:
            torch.cuda.empty_cache()
    write_rows(args.out, "decode_in_run.csv", rows)


if __name__ == "__main__":
    main()
