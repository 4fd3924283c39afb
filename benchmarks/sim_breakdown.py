"""Where a simulated step's time goes, per component, with and without the decode fast path.

    python benchmarks/sim_breakdown.py [--requests 2000] [--load 0.9] [--rate R]

The `sim_speed.py` case (`chat` on llama-2-7b / h200, default cost model, metrics and KV
accounting on) at `--load` times the replica's capacity, run twice in child processes:
`fast_path=False` (every step through the scheduler's per-request path) and `fast_path=True`.
Each child is sampled by py-spy (1 kHz, wall clock, idle samples dropped) when it is installed,
else profiled with cProfile (own time per function; it inflates call-heavy code, so compare the
two columns, not absolute values). Samples inside `simulate()` are attributed to the innermost
pagesim or SimPy frame and grouped by component; a component's share of the path's process
CPU time is reported in microseconds per step and per request-step (scheduled requests summed
over steps). The CPU time is the least of `--repeat` runs without a profiler (a sampled child
runs slower and the machine may be shared); the shares come from the sampled run with the least
CPU time of `--repeat` (py-spy pauses the child for each sample: slower, but whole stacks;
`--nonblocking` stacks were found to land on the wrong component). Prints a table; writes
results/sim_breakdown.csv.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from datetime import date
from pathlib import Path

CHILD = r"""
import cProfile, json, pstats, sys, time
from pagesim.config import EngineConfig
from pagesim.sim.build import default_profile
from pagesim.sim.simulate import LoadSpec, simulate
n, rate, fast, prof_out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
config = EngineConfig.create(model="llama-2-7b", gpu="h200")
load = LoadSpec(workload="chat", num_prompts=n, request_rate=rate, seed=0)
profile = default_profile(config)
prof = cProfile.Profile() if prof_out else None
t0, c0 = time.perf_counter(), time.process_time()
if prof:
    prof.enable()
sim = simulate(config, load, profile=profile, fast_path=fast)
if prof:
    prof.disable()
    prof.dump_stats(prof_out)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
steps = sim.metrics.steps
req_steps = int(sum(steps["num_reqs"]))
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "steps": sim.result["num_steps"],
                  "request_steps": req_steps}))
"""

# (component, path fragments of the innermost frame that count for it), first match wins
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("waste probe", ("pagesim/sim/probe.py", "pagesim/kvcache/waste.py")),
    ("synthetic tokens", ("pagesim/scheduler/output.py",)),
    ("scheduler", ("pagesim/scheduler/",)),
    ("KV manager + hashing", ("pagesim/kvcache/",)),
    ("runner + cost model", ("pagesim/sim/runner.py", "pagesim/cost/")),
    ("decode fast path", ("pagesim/sim/fast_path.py",)),
    ("engine loop", ("pagesim/sim/engine.py",)),
    ("metrics", ("pagesim/metrics/",)),
    ("SimPy", ("simpy/",)),
    (
        "workload + clients",
        (
            "pagesim/workload/",
            "pagesim/sim/simulate.py",
            "pagesim/sim/arrivals.py",
            "pagesim/request.py",
        ),
    ),
)


def component(frames: list[str]) -> str:
    """The component of the innermost frame that belongs to one (frames: outermost first)."""
    for frame in reversed(frames):
        for name, parts in COMPONENTS:
            if any(p in frame for p in parts):
                return name
    return "other"


def spy_shares(raw: Path) -> Counter:
    shares: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        inside = [
            i
            for i, f in enumerate(frames)
            if f.startswith("simulate (") and "pagesim/sim/simulate.py" in f
        ]
        if inside:
            shares[component(frames[inside[0] :])] += int(n)
    return shares


def cprofile_shares(path: Path) -> Counter:
    import pstats

    shares: Counter = Counter()
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, _, tottime, _, _) in stats.items():
        shares[component([filename])] += tottime
    return shares


def run(n: int, rate: float, fast: bool, spy: str | None) -> tuple[dict, Counter]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile"
        args = [sys.executable, "-c", CHILD, str(n), str(rate), "1" if fast else "0"]
        if spy:
            cmd = [spy, "record", "-r", "1000", "-f", "raw", "-o", str(out), "--", *args, ""]
        else:
            cmd = [*args, str(out)]
        proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
        stats = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
        shares = spy_shares(out) if spy else cprofile_shares(out)
    return stats, shares


def unprofiled(n: int, rate: float, fast: bool) -> dict:
    """The child's stats without any profiler (its CPU time is the one reported)."""
    args = [sys.executable, "-c", CHILD, str(n), str(rate), "1" if fast else "0", ""]
    proc = subprocess.run(args, check=True, capture_output=True, text=True)
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument(
        "--rate",
        type=float,
        default=None,
        help="req/s; default: --load times the capacity measured as sim_speed.py does",
    )
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--out", default="results/sim_breakdown.csv")
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs per path; the one with the least CPU time is reported",
    )
    args = ap.parse_args()
    rate = args.rate
    if rate is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from sim_speed import run_child

        rate = args.load * run_child(1000, float("inf"))["request_throughput"]
    spy = shutil.which("py-spy")
    results = {}
    for fast in (False, True):
        runs = [run(args.requests, rate, fast, spy) for _ in range(args.repeat)]
        stats, shares = min(runs, key=lambda r: r[0]["cpu_s"])
        plain = min(
            (unprofiled(args.requests, rate, fast) for _ in range(args.repeat)),
            key=lambda r: r["cpu_s"],
        )
        stats.update(profiled_cpu_s=stats["cpu_s"], cpu_s=plain["cpu_s"], wall_s=plain["wall_s"])
        results[fast] = stats, shares
    method = "py-spy" if spy else "cProfile"
    names = [name for name, _ in COMPONENTS] + ["other"]
    rows = []
    print(f"chat, {args.requests} requests at {rate:.3f} req/s; shares by {method}")
    for fast in (False, True):
        s = results[fast][0]
        print(
            f"  fast_path={fast}: cpu {s['cpu_s']:.2f} s (least of {args.repeat}, "
            f"{s['profiled_cpu_s']:.2f} s sampled), wall {s['wall_s']:.2f} s, "
            f"{s['steps']} steps, {s['request_steps'] / s['steps']:.1f} requests per step"
        )
    print(
        f"{'component':<22} {'slow us/step':>12} {'fast us/step':>12} "
        f"{'slow us/req-step':>16} {'fast us/req-step':>16}"
    )
    for name in names + ["total"]:
        row = {"component": name}
        for fast, label in ((False, "slow"), (True, "fast")):
            stats, shares = results[fast]
            total = sum(shares.values()) or 1
            share = 1.0 if name == "total" else shares.get(name, 0) / total
            cpu_us = stats["cpu_s"] * 1e6 * share
            row[f"{label}_us_per_step"] = cpu_us / stats["steps"]
            row[f"{label}_us_per_request_step"] = cpu_us / stats["request_steps"]
        rows.append(row)
        print(
            f"{name:<22} {row['slow_us_per_step']:>12.1f} {row['fast_us_per_step']:>12.1f} "
            f"{row['slow_us_per_request_step']:>16.3f} {row['fast_us_per_request_step']:>16.3f}"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        f.write(
            f"# pagesim sim_breakdown, {date.today()}, python {platform.python_version()}, "
            f"{method}, chat {args.requests} requests at {rate:.3f} req/s, "
            f"slow cpu {results[False][0]['cpu_s']:.2f} s, "
            f"fast cpu {results[True][0]['cpu_s']:.2f} s\n"
        )
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
