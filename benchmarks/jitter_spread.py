"""Do identical real runs differ as much as the simulator says step-time noise would make them?

A real run repeated with the same requests at the same times (`gpu_session.py --passes`)
does not come out the same: mean TPOT moves by up to 5 % at 85 % load
(`results/validation/README.md`, "Identical runs served again"). Each served step's time
scatters by about 1 % around its shape's (two consecutive decode steps of one batch differ
by that much), and under load a step that ends a little later lets one more arrival into
the next batch: the schedules part, and the queue amplifies the difference.

This benchmark puts that noise into the simulator and compares spreads. For every group of
repeated runs in the stored calls of repeats (`gpu_calls.REPEATED`):

- sigma: the group's per-step noise, the standard deviation of the relative difference of
  consecutive decode-only steps of one batch size, over the square root of 2 (wall time of
  the runner's steps);
- the real spread: per metric, the sample standard deviation of the real runs, % of their
  mean;
- the simulated spread: the same workload simulated `--replicas` times, every step's time
  multiplied by (1 + sigma z), z standard normal from the replica's seed
  (`JitteredCostModel`); the standard deviation of those replicas, % of their mean;
- the run-level part: each run's step-time level, the profile's summed step time over the
  run's real schedule against the real one (`sensitivity.step_error_pct`), whose standard
  deviation over the group's runs, times the metric's amplification (`sensitivity`: the
  workload simulated with every step 2 % slower and faster), is the spread that a whole run
  being faster or slower would give.

If the simulated spreads match the real ones, the run-to-run differences are what step noise
of that size does to the schedule; if the run-level part does, each run had a speed of its
own. Either way no prediction can be nearer to a single run than the runs are to each other.

    python benchmarks/jitter_spread.py [--replicas 8] [--out results/validation/jitter_spread]

Prints the table; writes `<out>.md` and `<out>.csv` (one row per group and metric).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gpu_calls import REPEATED, RESULTS, SHIPPED
from sensitivity import METRICS, amplifications, step_error_pct

from pagesim.cost.base import BatchShape, CostModel
from pagesim.sim.build import build_cost_model
from pagesim.validate import (
    base_run_name,
    read_real_run,
    real_run_config,
    real_run_files,
    simulate_like,
)

#: A step's time is never scaled below this share of its priced time (z is clipped).
MIN_FACTOR = 0.5
#: Every step this much slower and faster gives a metric's amplification (`sensitivity`).
AMP_SCALE = 0.02


@dataclass
class JitteredCostModel:
    """`base`'s step times, each times (1 + sigma z) with z standard normal, drawn in step
    order from `seed`: one replica of a run whose steps scatter as a GPU's do."""

    base: CostModel
    sigma: float
    seed: int
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @property
    def reread_fraction(self):
        """The base model's shared-prefix read cost (`ScaledCostModel` says why)."""
        return getattr(self.base, "reread_fraction", None)

    def step_time(self, batch: BatchShape) -> float:
        factor = max(MIN_FACTOR, 1.0 + self.sigma * float(self._rng.standard_normal()))
        return self.base.step_time(batch) * factor


def step_noise(docs: list[dict]) -> float:
    """The runs' per-step noise: std of the relative difference of consecutive decode-only
    steps with the same number of requests, over sqrt(2) (each step carries its own)."""
    diffs = []
    for doc in docs:
        rs = doc["records"]["runner_steps"]
        wall, reqs = np.array(rs["wall_s"]), np.array(rs["num_reqs"])
        prefill = np.array(rs["num_prefill_tokens"])
        ok = (prefill[:-1] == 0) & (prefill[1:] == 0) & (reqs[:-1] == reqs[1:])
        diffs.append((wall[1:][ok] - wall[:-1][ok]) / wall[:-1][ok])
    return float(np.concatenate(diffs).std() / math.sqrt(2.0))


def groups() -> list[tuple[str, str, str, list[Path]]]:
    """(call, model, run, paths) of every group of two or more repeats in the REPEATED calls."""
    out = []
    for call in sorted(REPEATED):
        for folder in sorted((RESULTS / call / "real").iterdir()):
            by: dict[str, list[Path]] = {}
            for path in real_run_files(folder):
                by.setdefault(base_run_name(path.name.split(".")[0]), []).append(path)
            out += [
                (call, folder.name, run, paths)
                for run, paths in sorted(by.items())
                if len(paths) > 1
            ]
    return out


def pct_std(values: list[float]) -> float:
    """Sample standard deviation in % of the mean."""
    return 100.0 * statistics.stdev(values) / statistics.mean(values)


def group_rows(args: tuple[str, str, str, list[Path], int]) -> list[dict]:
    """One group: per metric, the real and the simulated spread."""
    call, model, run, paths, replicas = args
    docs = [read_real_run(p) for p in paths]
    sigma = step_noise(docs)
    profile = SHIPPED / model
    base = build_cost_model(real_run_config(docs[0]), profile)
    sims = [
        simulate_like(docs[0], None, JitteredCostModel(base, sigma, seed)).result
        for seed in range(replicas)
    ]
    levels = [step_error_pct(d, base) for d in docs]
    _, amps = amplifications(docs[0], base, AMP_SCALE)
    rows = []
    for m in METRICS:
        real = [d["result"][m] for d in docs]
        sim = [s[m] for s in sims]
        amp = amps[m]
        rows.append(
            {
                "call": call,
                "model": model,
                "run": run,
                "metric": m,
                "runs": len(docs),
                "replicas": replicas,
                "step_noise_pct": round(100.0 * sigma, 3),
                "real_std_pct": round(pct_std(real), 3),
                "sim_std_pct": round(pct_std(sim), 3),
                "level_std_pct": round(statistics.stdev(levels), 3),
                "amplification": round(amp, 3),
                "level_spread_pct": round(abs(amp) * statistics.stdev(levels), 3),
            }
        )
    return rows


def pooled(values: list[float]) -> float:
    """Root mean square: the groups' spreads pooled."""
    return math.sqrt(sum(v * v for v in values) / len(values))


def markdown(rows: list[dict], replicas: int) -> str:
    lines = [
        "Run-to-run spread of repeated real runs against the simulator's with step-time "
        f"noise ({replicas} replicas per group, shipped profiles)",
        "",
        "step noise: per-step std of the group's served decode steps, %; real and "
        "jitter: standard deviation of the metric over the real runs and over the jittered "
        "replicas, % of the mean; run level: std over the runs of their step-time level, "
        "% (the profile's summed step time on each run's schedule), times the metric's "
        "amplification",
        "",
        "| call | model | run | runs | step noise % | metric | real std % | jitter std % "
        "| level std % | amplification | run level % |",
        "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['call']} | {r['model']} | {r['run']} | {r['runs']} | "
            f"{r['step_noise_pct']:.2f} | {r['metric']} | {r['real_std_pct']:.2f} | "
            f"{r['sim_std_pct']:.2f} | {r['level_std_pct']:.2f} | "
            f"{r['amplification']:.2f} | {r['level_spread_pct']:.2f} |"
        )
    lines += [
        "",
        "Pooled over the groups (root mean square of the groups' spreads):",
        "",
        "| metric | groups | real std % | jitter std % | run level % |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for m in METRICS:
        rs = [r for r in rows if r["metric"] == m]
        lines.append(
            f"| {m} | {len(rs)} | {pooled([r['real_std_pct'] for r in rs]):.2f} | "
            f"{pooled([r['sim_std_pct'] for r in rs]):.2f} | "
            f"{pooled([r['level_spread_pct'] for r in rs]):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "jitter_spread")
    args = ap.parse_args()
    if args.replicas < 2:
        ap.error("--replicas: at least 2")
    tasks = [(*g, args.replicas) for g in groups()]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [r for rs in pool.map(group_rows, tasks) for r in rs]
    text = markdown(rows, args.replicas)
    print(text)
    args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    with open(args.out.with_suffix(".csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
