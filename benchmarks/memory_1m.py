"""Peak memory at scale: one run of N `chat` requests (1,000,000 by default) at a fixed rate.

    python benchmarks/memory_1m.py [--num-prompts 1000000] [--request-rate 5] [--records]

llama-2-7b on h200 with the shipped calibration profile, as `pagesim run` simulates it; the
target is a peak RSS under 2 GB (2,000 MB) for 1M requests. The run happens in a fresh child
process so that its peak RSS (ru_maxrss) is its own. `--records` also writes the per-request
and per-step Parquet files (`--result-dir`; the steps are streamed a row group at a time). Prints a table;
writes results/memory_1m.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
from datetime import date
from pathlib import Path

CHILD = r"""
import json, os, resource, sys, tempfile, time
from pathlib import Path
from pagesim.config import EngineConfig
from pagesim.sim.build import default_profile
from pagesim.sim.output import write_parquet
from pagesim.sim.simulate import LoadSpec, simulate
n, rate, records = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"
config = EngineConfig.create(model="llama-2-7b", gpu="h200")
load_avg = os.getloadavg()[0]
t0, c0 = time.perf_counter(), time.process_time()
sim = simulate(config, LoadSpec(workload="chat", num_prompts=n, request_rate=rate, seed=0),
               profile=default_profile(config))
if records:
    with tempfile.TemporaryDirectory() as d:
        write_parquet(sim.metrics, Path(d), "run")
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
r = sim.result
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "load_avg_1m": load_avg,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "steps": r["num_steps"], "completed": r["completed"],
                  "sim_duration_s": r["duration"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=1_000_000)
    ap.add_argument("--request-rate", type=float, default=5.0)
    ap.add_argument("--records", action="store_true", help="also write the Parquet files")
    ap.add_argument("--out", default="results/memory_1m.csv")
    args = ap.parse_args()
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            str(args.num_prompts),
            str(args.request_rate),
            "1" if args.records else "0",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row = {"requests": args.num_prompts, "rate": args.request_rate, "records": args.records, **row}
    print(
        f"{'requests':>9} {'rate':>5} {'records':>7} {'wall s':>8} {'cpu s':>8} "
        f"{'peak MB':>8} {'steps':>9} {'load':>5}"
    )
    print(
        f"{row['requests']:>9} {row['rate']:>5g} {str(row['records']):>7} {row['wall_s']:>8.1f} "
        f"{row['cpu_s']:>8.1f} {row['peak_rss_mb']:>8.0f} {row['steps']:>9} "
        f"{row['load_avg_1m']:>5.1f}"
    )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(
            f"# pagesim memory_1m, {date.today()}, python {platform.python_version()}, "
            f"{platform.processor() or platform.machine()}\n"
        )
        w = csv.DictWriter(f, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
