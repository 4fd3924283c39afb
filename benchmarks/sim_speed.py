"""Simulator speed: wall time and peak memory to simulate N requests of `chat` near saturation.

    python benchmarks/sim_speed.py [--sizes 1000,10000,100000] [--load 0.9]

llama-2-7b on h200 with the default cost model (the shipped calibration profile when there is
one), metrics and KV accounting on. The rate is `--load` times the replica's capacity, measured
first as the request throughput of a 1,000-request run with all requests at t=0. Each size runs
in a fresh process so that its peak RSS is its own. Wall time is what the target is stated in;
the process's CPU time is reported beside it because the benchmark machine may be shared (the
load average at the start of each run is recorded too). `--repeat N` runs each size N times
(below 100,000 requests; `--repeat-large` too) and keeps the fastest, with the median of the
N wall times beside it. `--slow` runs every step through the
per-request path (`simulate(..., bulk_decodes=False)`), for comparison. Prints a table; writes
results/sim_speed.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import subprocess
import sys
from datetime import date
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, time
from pagesim.config import EngineConfig
from pagesim.sim.build import default_profile
from pagesim.sim.simulate import LoadSpec, simulate
n, rate, fast = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
config = EngineConfig.create(model="llama-2-7b", gpu="h200")
load_avg = os.getloadavg()[0]
t0, c0 = time.perf_counter(), time.process_time()
sim = simulate(config, LoadSpec(workload="chat", num_prompts=n, request_rate=rate, seed=0),
               profile=default_profile(config), bulk_decodes=fast)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
r = sim.result
tokens = r["total_input_tokens"] + r["total_output_tokens"]
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "load_avg_1m": load_avg, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "steps": r["num_steps"], "sim_duration_s": r["duration"], "tokens": tokens,
                  "request_throughput": r["request_throughput"], "completed": r["completed"],
                  "mean_num_running": r["mean_num_running"]}))
"""


def run_child(n: int, rate: float, fast: bool = True) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n), str(rate), "1" if fast else "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--out", default="results/sim_speed.csv")
    ap.add_argument("--slow", action="store_true", help="bulk_decodes=False (per-request path)")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per size below 100,000 requests; the fastest (wall) is kept",
    )
    ap.add_argument(
        "--repeat-large",
        action="store_true",
        help="--repeat applies to 100,000 requests and more as well",
    )
    args = ap.parse_args()
    capacity = run_child(1000, float("inf"))["request_throughput"]
    rate = args.load * capacity
    rows = []
    print(f"capacity {capacity:.3f} req/s (1,000 requests at t=0); rate {rate:.3f} req/s")
    print(
        f"{'requests':>9} {'wall s':>8} {'median':>8} {'cpu s':>8} {'peak MB':>8} {'steps':>8} {'sim s':>9} "
        f"{'Mtok/wall s':>11} {'running':>8} {'load':>5}"
    )
    for n in (int(x) for x in args.sizes.split(",")):
        runs = [
            run_child(n, rate, fast=not args.slow)
            for _ in range(args.repeat if n < 100_000 or args.repeat_large else 1)
        ]
        r = min(runs, key=lambda x: x["wall_s"])
        r.update(
            requests=n,
            rate=rate,
            capacity=capacity,
            bulk_decodes=not args.slow,
            tokens_per_wall_s=r["tokens"] / r["wall_s"],
            runs=len(runs),
            wall_s_median=statistics.median(x["wall_s"] for x in runs),
        )
        rows.append(r)
        print(
            f"{n:>9} {r['wall_s']:>8.2f} {r['wall_s_median']:>8.2f} {r['cpu_s']:>8.2f} {r['peak_rss_mb']:>8.0f} "
            f"{r['steps']:>8} {r['sim_duration_s']:>9.1f} {r['tokens_per_wall_s'] / 1e6:>11.2f} "
            f"{r['mean_num_running']:>8.1f} {r['load_avg_1m']:>5.1f}"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(
            f"# pagesim sim_speed, {date.today()}, python {platform.python_version()}, "
            f"{platform.processor() or platform.machine()}, one process per size\n"
        )
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
