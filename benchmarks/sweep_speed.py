"""Sweep throughput: a 100-point grid of 2,000-request runs through `pagesim sweep`'s runner.

    python benchmarks/sweep_speed.py [--jobs 2] [--num-prompts 2000] [--quick]

Grid (100 points, one run each, llama-2-7b on h200, the shipped calibration when present, else
the analytical cost model): block_size
{8, 16, 32, 64, 128} x request_rate {1, 2, 3, 4, 5} req/s x enable_prefix_caching {on, off}
x workload {chat, system-prompt}. The sweep's files go to a temporary directory; the wall
time, runs per second and the machine go to results/sweep_speed.csv (one row appended per
invocation, with the machine's 15-minute load average: other processes on the same cores
slow the sweep down), and a table is printed.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

from pagesim.planning.grid import build_grid
from pagesim.planning.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "sweep_speed.csv"


def grid(num_prompts: int, quick: bool):
    axes = {
        "block_size": [8, 16, 32, 64, 128],
        "request_rate": [1.0, 2.0, 3.0, 4.0, 5.0],
        "enable_prefix_caching": [True, False],
        "workload": ["chat", "system-prompt"],
    }
    if quick:
        axes = {"block_size": [16, 32], "request_rate": [2.0, 4.0]}
    return build_grid(axes, base={"num_prompts": num_prompts})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="4 points (a smoke run)")
    args = ap.parse_args()
    g = grid(args.num_prompts, args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        res = run_sweep(g, output_dir=tmp, timestamp="bench", n_jobs=args.jobs, progress=True)
        wall = time.perf_counter() - start
    ok = int((res.summary["status"] == "ok").sum())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    row = {
        "date": datetime.now().strftime("%Y-%m-%d %H:%M"),
        "commit": commit,
        "points": len(g),
        "runs": len(res.summary),
        "ok_runs": ok,
        "requests_per_run": args.num_prompts,
        "jobs": args.jobs,
        "cost_model": "calibrated"
        if (res.summary["profile"] != "analytical").any()
        else "analytical",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "wall_s": round(wall, 1),
        "runs_per_min": round(60.0 * len(res.summary) / wall, 2),
        "sim_requests_per_s": round(len(res.summary) * args.num_prompts / wall, 1),
        # other work on the machine slows the sweep: the 15-minute load average at the end
        "loadavg_15m_end": round(os.getloadavg()[2], 2),
    }
    width = max(len(k) for k in row)
    for k, v in row.items():
        print(f"{k:<{width}}  {v}")
    if not args.quick:
        new = not OUT.exists()
        OUT.parent.mkdir(parents=True, exist_ok=True)
        with OUT.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(row))
            if new:
                w.writeheader()
            w.writerow(row)
        print(f"appended to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
