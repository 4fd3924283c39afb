"""Where a served decode step's host time goes: the runner's parts, timed and profiled (GPU).

A served decode-graph step is `execute_model`'s host wall clock. Its device part (CUDA events:
forward, LM head, sampler) is the same from GPU call to GPU call; the host time around it
moves between calls by a factor of 2.5 to 4 (`benchmarks/host_in_step.py`). This times decode
steps shaped as served ones in a served runner (CUDA graphs, the full KV cache) and splits
each into its parts:

    prepare   the inputs built on the host and copied (`t_prep` of `execute_model`)
    device    swap, copy-on-write, forward and sampler, by CUDA events
    rest      the wall clock less both: launching, the sync that reads the sampled tokens,
              building the step's output

then runs cProfile over the same steps and lists the host functions with the most own time.
Each step runs twice (`--waits`): with the host blocking in the driver until the sampled ids
arrive (`block`, the runner's default) and busy-polling an event instead (`spin`), which keeps
the core awake between steps.
The steps: decode batches of 8, 32 and 128 sequences over 1,024-token contexts, and 32
sequences behind one shared 1,024-token prefix with own parts of 0-512 tokens (a
system-prompt batch, whose block-table rows are longer).

    PYTHONPATH=. python3 benchmarks/runner_host.py --models llama-2-7b --out $OUT

Prints both tables; writes runner_host.csv (per step: wall, prepare, device and rest in us,
medians) and runner_host_profile.csv (per step: the top functions by own time, us per step)
under --out. cProfile slows what it profiles, so the second table gives shares, not times.
`--dry-run-cpu` runs the tiny model under the Triton interpreter with small steps.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import time


def steps_for(dry: bool) -> dict[str, tuple[list[tuple[int, int]], int]]:
    """Step name -> ((context, new tokens) per sequence, shared prefix tokens)."""
    if dry:
        return {
            "chat 2 x 24": ([(24, 1)] * 2, 0),
            "system-prompt 2 x (16 + 8)": ([(24, 1)] * 2, 16),
        }
    own = [round(512 * i / 31) for i in range(32)]
    return {
        "chat 8 x 1,024": ([(1024, 1)] * 8, 0),
        "chat 32 x 1,024": ([(1024, 1)] * 32, 0),
        "chat 128 x 1,024": ([(1024, 1)] * 128, 0),
        "system-prompt 32 x (1,024 + 0-512)": ([(1024 + o, 1) for o in own], 1024),
    }


def timed_parts(runner, out, n: int) -> dict[str, float]:
    """Medians over `n` calls of the step's wall clock and its parts, in us."""
    parts: dict[str, list[float]] = {"wall": [], "prepare": [], "device": [], "rest": []}
    for _ in range(n):
        t = time.perf_counter()
        res = runner.execute_model(out)
        wall = time.perf_counter() - t
        b = res.time_breakdown_s
        device = sum(b.get(k, 0.0) for k in ("swap", "copy", "forward", "sample"))
        for key, value in (
            ("wall", wall),
            ("prepare", b["prepare"]),
            ("device", device),
            ("rest", wall - b["prepare"] - device),
        ):
            parts[key].append(value * 1e6)
    return {k: statistics.median(v) for k, v in parts.items()}


def top_functions(runner, out, n: int, k: int) -> list[dict]:
    """The `k` functions with the most own time over `n` profiled calls, per call."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        runner.execute_model(out)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, ...)
    total = sum(v[2] for v in stats.values())
    rows = []
    for (file, line, name), (_, ncalls, own, cum, _) in sorted(
        stats.items(), key=lambda kv: -kv[1][2]
    )[:k]:
        where = f"{os.path.basename(file)}:{line}" if line else file
        rows.append(
            {
                "function": f"{where}({name})",
                "calls_per_step": ncalls / n,
                "own_us_per_step": own / n * 1e6,
                "cum_us_per_step": cum / n * 1e6,
                "own_share_pct": 100 * own / total,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--steps", type=int, default=200, help="timed calls per step")
    ap.add_argument("--profiled", type=int, default=100, help="profiled calls per step")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--waits",
        default="block,spin",
        help="how the host waits for the sampled ids: block, spin (both by default)",
    )
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from gpu_bench import device_columns, dry_runner, release, served_runner, write_rows

    from pagesim.gpu.calibrate import BlockSource, synthetic_step
    from pagesim.gpu.device import device_info

    dry = args.dry_run_cpu
    steps, profiled = (2, 2) if dry else (args.steps, args.profiled)
    info = device_info(None if dry else torch.device("cuda"))
    rows, prof_rows = [], []
    gc.disable()  # as during a served run (`serve.replay`)
    for name in args.models.split(","):
        config, runner = (
            dry_runner(64, max_num_batched_tokens=64, max_model_len=256)
            if dry
            else served_runner(name)
        )
        for i, (label, (entries, shared)) in enumerate(steps_for(dry).items()):
            out = synthetic_step(
                entries, config.block_size, BlockSource(runner.num_gpu_blocks, i), shared=shared
            )
            for wait in args.waits.split(","):
                runner.spin_wait = wait == "spin"
                for _ in range(3):  # warm-up: compiles, captures the graph
                    runner.execute_model(out)
                parts = timed_parts(runner, out, steps)
                rows.append(
                    {
                        "model": name,
                        "step": label,
                        "wait": wait,
                        "calls": steps,
                        **{f"{k}_us": round(v, 1) for k, v in parts.items()},
                        **device_columns(info),
                    }
                )
                print(
                    f"{name} {label:36s} {wait:5s} wall {parts['wall']:8.1f} us  prepare "
                    f"{parts['prepare']:7.1f}  device {parts['device']:8.1f}  rest "
                    f"{parts['rest']:7.1f}",
                    flush=True,
                )
                for rank, r in enumerate(top_functions(runner, out, profiled, args.top), 1):
                    prof_rows.append(
                        {
                            "model": name,
                            "step": label,
                            "wait": wait,
                            "rank": rank,
                            **{k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()},
                        }
                    )
                    print(
                        f"    {r['own_share_pct']:5.1f} %  {r['own_us_per_step']:8.1f} us  "
                        f"x{r['calls_per_step']:<6g} {r['function']}",
                        flush=True,
                    )
            runner.spin_wait = False
        if not dry:
            release(runner)
        write_rows(args.out, "runner_host.csv", rows)  # after each model: a cut run keeps it
        write_rows(args.out, "runner_host_profile.csv", prof_rows)
    gc.enable()


if __name__ == "__main__":
    main()
