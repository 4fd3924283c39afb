"""Cost per simulated step of the cost models' hot path.

Times `BatchShape.from_scheduler_output(out)` alone and followed by `step_time` for the
analytical and the calibrated model, on decode steps of 1, 32, 128 and 256 requests and on a
mixed step (one 512-token chunk plus 127 decodes). Prints a table and writes
results/cost_step_time.csv. The calibrated model reads the SYNTHETIC test profile (its speed
does not depend on the numbers in it). Timed in process CPU time (`time.process_time`), best of
the repeats, so that other processes on a shared box inflate the figures less than wall time.

    python benchmarks/cost_step_time.py [--repeat 7] [--number 20000]
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import time
import timeit
from pathlib import Path

from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cost"))
from synthetic_profile import FIXTURE_DIR, GPU, MODEL  # noqa: E402


def make_output(num_decode: int, chunk: int = 0) -> SchedulerOutput:
    sched = [
        ScheduledRequest(Request(f"r{i}", [i + 1] * 8, 64), 1, 300 + 7 * i, [i])
        for i in range(num_decode)
    ]
    if chunk:
        sched.append(ScheduledRequest(Request("p", [7] * 2048, 64), chunk, 1024, [0]))
    return SchedulerOutput(0, sched, num_decode + chunk, block_size=16)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--number", type=int, default=20000)
    args = ap.parse_args()
    models = {
        "analytical": AnalyticalCostModel(MODEL, GPU),
        "calibrated": CalibratedCostModel(Profile.load(FIXTURE_DIR)),
    }
    cases = {f"decode x{n}": make_output(n) for n in (1, 32, 128, 256)}
    cases["chunk 512 + decode x127"] = make_output(127, chunk=512)
    rows = []
    for case, out in cases.items():

        def shape_only(out=out):
            BatchShape.from_scheduler_output(out)

        timers = {"from_scheduler_output": shape_only}
        for name, m in models.items():
            timers[f"+ {name}.step_time"] = lambda out=out, m=m: m.step_time(
                BatchShape.from_scheduler_output(out)
            )
        for what, fn in timers.items():
            best = min(
                timeit.repeat(fn, repeat=args.repeat, number=args.number, timer=time.process_time)
            )
            rows.append((case, what, best / args.number * 1e6))
    load = os.getloadavg()[0]  # other processes on the box inflate every figure
    print(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, "
        f"1-min load {load:.2f}; CPU time, best of {args.repeat} x {args.number} calls"
    )
    print(f"{'step':<26}{'timed':<34}{'us/call':>9}")
    for case, what, us in rows:
        print(f"{case:<26}{what:<34}{us:>9.2f}")
    out_path = ROOT / "results" / "cost_step_time.csv"
    out_path.parent.mkdir(exist_ok=True)
    with open(out_path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["step", "timed", "us_per_call", "python", "repeat", "number", "load_1min"])
        for case, what, us in rows:
            w.writerow(
                [
                    case,
                    what,
                    f"{us:.3f}",
                    platform.python_version(),
                    args.repeat,
                    args.number,
                    f"{load:.2f}",
                ]
            )
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
