"""Cost of workloads: loading, sampling a 100k-request plan, and materializing prompts.

For each workload: seconds to load the spec and its trace, seconds and peak Python-heap bytes
(tracemalloc) to sample a plan of `--num-plan` requests, the plan's array bytes, and the
median over `--repeats` of the time to materialize the prompts of `--num-materialize`
first turns as `list[int]` (the simulator's per-request cost at admission), in requests/s and
tokens/s. One process, one core.

Usage: python benchmarks/workload_plan.py [--num-plan 100000] [--num-materialize 10000]
Writes results/workload_plan.csv.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pagesim.workload import load_workload  # noqa: E402

NAMES = [
    "random",
    "chat",
    "conversation",
    "system-prompt",
    "multi-turn",
    "mix",
    "mooncake-conversation",
]


def plan_bytes(plan) -> int:
    """Bytes held by the plan's numpy arrays."""
    return sum(
        getattr(plan, f).nbytes
        for f in plan.__dataclass_fields__
        if isinstance(getattr(plan, f), np.ndarray)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-plan", type=int, default=100_000)
    ap.add_argument("--num-materialize", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    print(
        f"{'workload':24} {'load s':>7} {'sample s':>8} {'peak MB':>8} {'plan MB':>8} "
        f"{'mat req/s':>10} {'mat Mtok/s':>10} {'spread':>14}"
    )
    for name in NAMES:
        t0 = time.perf_counter()
        w = load_workload(name)
        load_s = time.perf_counter() - t0
        tracemalloc.start()
        t0 = time.perf_counter()
        plan = w.sample(args.num_plan, seed=0)
        sample_s = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        firsts = plan.first_turns[: args.num_materialize].tolist()
        tokens = int(plan.prompt_lens[firsts].sum())
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for i in firsts:
                plan.materialize(i)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        row = dict(
            workload=name,
            num_plan=args.num_plan,
            load_s=round(load_s, 4),
            sample_s=round(sample_s, 4),
            sample_peak_mb=round(peak / 2**20, 1),
            plan_mb=round(plan_bytes(plan) / 2**20, 1),
            num_materialize=len(firsts),
            materialize_s_median=round(med, 4),
            materialize_s_min=round(min(times), 4),
            materialize_s_max=round(max(times), 4),
            tokens_per_s=round(tokens / med),
            requests_per_s=round(len(firsts) / med),
            python=platform.python_version(),
            numpy=np.__version__,
            date=datetime.date.today().isoformat(),
        )
        rows.append(row)
        print(
            f"{name:24} {load_s:7.3f} {sample_s:8.3f} {peak / 2**20:8.1f} "
            f"{row['plan_mb']:8.1f} {row['requests_per_s']:10d} {tokens / med / 1e6:10.1f} "
            f"{min(times):6.2f}..{max(times):.2f}s"
        )
    out = ROOT / "results" / "workload_plan.csv"
    out.parent.mkdir(exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
