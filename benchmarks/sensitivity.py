"""How a step-time error becomes a metric error: amplification per run, over every stored call.

A calibrated profile prices a served step within a few % of its wall time, and how far off it
is moves from one GPU call to the next (the GPU's level that day). What a user reads is not
the step time but TTFT, TPOT and E2E, and near saturation queueing turns a step that is 1 %
slow into latencies several % slow. This benchmark measures that gain and asks how much of
the validation error it explains.

For every stored real run of the shipped profile's runner (every call of the staged runner,
the held-out call included):

- `step err`: the profile's summed step time over the run's real schedule against the real
  one (`step_replay.replay_shapes`; priced: `CostModel.step_time`, host time between steps
  included; real: schedule + execute + update of every step), in %;
- the metric errors of `pagesim validate` (predicted against real, %);
- the amplification of each metric: the same workload simulated with every step `--scale`
  slower and faster (`pagesim.cost.scaled.ScaledCostModel`),
  `(m(1 + s) - m(1 - s)) / (2 s m(1))`: the metric's % change per 1 % of step time.

Per workload and load, over the calls: the amplification (median), the rms of the metric
error, and the rms of what is left of it once the step error times the amplification is
taken out. Where the second is much smaller than the first, the metric errors are the step
errors, amplified: the scheduling and queueing are right, and what misses is the GPU's speed in
that call.

    python benchmarks/sensitivity.py --model llama-3-8b [--profile DIR] [--scale 0.02] \\
        [--out results/validation/sensitivity_llama-3-8b]

Prints the table; writes `<out>.md` and `<out>.csv` (one row per run and metric).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpu_calls import PARTIAL, ROOT, SHIPPED, SKIP, call_runs, shipped_runner
from step_replay import replay_shapes

from pagesim.cost.base import CostModel
from pagesim.cost.scaled import ScaledCostModel
from pagesim.sim.build import build_cost_model
from pagesim.validate import compare, read_real_run, real_run_config, real_run_files, simulate_like

#: the metrics whose targets are within 3 or 5 %, and the P99s of TTFT and TPOT
METRICS = (
    "request_throughput",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
    "p99_ttft_ms",
    "p99_tpot_ms",
)


def step_error_pct(doc: dict, cost: CostModel) -> float:
    """The profile's summed step time over the run's replayed schedule against the real one,
    in % (steps the replay could not rebuild are left out of both sums)."""
    st = doc["records"]["steps"]
    shapes = replay_shapes(doc)
    real = priced = 0.0
    for i, shape in enumerate(shapes):
        if shape is None or not st["num_reqs"][i]:
            continue
        real += st["schedule_s"][i] + st["execute_s"][i] + st["update_s"][i]
        priced += cost.step_time(shape)
    return 100.0 * (priced / real - 1.0)


def amplifications(doc: dict, cost: CostModel, scale: float) -> tuple[dict, dict[str, float]]:
    """The stored run's traffic simulated as `cost` prices it, and each of `METRICS`' %
    change per 1 % of step time: `(m(1 + s) - m(1 - s)) / (2 s m(1))`, with every step
    `scale` slower and faster."""
    base = simulate_like(doc, None, cost).result
    lo, hi = (
        simulate_like(doc, None, ScaledCostModel(cost, f)).result
        for f in (1.0 - scale, 1.0 + scale)
    )
    return base, {m: (hi[m] - lo[m]) / (2.0 * scale * base[m]) for m in METRICS if base.get(m)}


def run_rows(args: tuple[str, Path, Path, float]) -> list[dict]:
    """One stored run: per metric, the error, the amplification and the step error."""
    call, path, profile, scale = args
    doc = read_real_run(path)
    if doc["result"].get("truncated"):
        return []
    cost = build_cost_model(real_run_config(doc), profile)
    step_err = step_error_pct(doc, cost)
    base, amps = amplifications(doc, cost, scale)
    errors = {r["metric"]: r["error_pct"] for r in compare(doc["result"], base)}
    rows = []
    for m in METRICS:
        if m not in errors or m not in amps:
            continue
        amp = amps[m]
        rows.append(
            {
                "call": call,
                "run": path.name.split(".")[0],
                "metric": m,
                "error_pct": round(errors[m], 3),
                "amplification": round(amp, 3),
                "step_error_pct": round(step_err, 3),
                "residual_pct": round(errors[m] - amp * step_err, 3),
            }
        )
    return rows


def rms(values: list[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values))


def summary(rows: list[dict]) -> list[dict]:
    """Per run and metric, over the calls."""
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["run"], r["metric"]), []).append(r)
    out = []
    for (run, metric), rs in sorted(by.items()):
        out.append(
            {
                "run": run,
                "metric": metric,
                "calls": len(rs),
                "amplification": statistics.median(r["amplification"] for r in rs),
                "step_error_rms": rms([r["step_error_pct"] for r in rs]),
                "error_rms": rms([r["error_pct"] for r in rs]),
                "residual_rms": rms([r["residual_pct"] for r in rs]),
            }
        )
    return out


def markdown(model: str, profile: Path, scale: float, rows: list[dict], calls: list[str]) -> str:
    summ = summary(rows)
    lines = [
        f"{model}: how step-time errors become metric errors, profile `{profile}`, "
        f"steps scaled by 1 -/+ {scale:g}; {len(calls)} calls ({', '.join(calls)})",
        "",
        "amplification: the metric's % change per 1 % of step time (median over the calls); "
        "step err: the profile's summed step time on the real schedule, rms over the calls; "
        "error: the validation error, rms over the calls; left: rms of error - "
        "amplification x step err",
        "",
        "| run | metric | amplification | step err % | error % | left % |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in summ:
        lines.append(
            f"| {s['run']} | {s['metric']} | {s['amplification']:+.2f} | "
            f"{s['step_error_rms']:.1f} | {s['error_rms']:.1f} | "
            f"{s['residual_rms']:.1f} |"
        )
    lines += [
        "",
        "Per call, its runs' step errors: their mean (the call's level) and their rms "
        "about it (what differs between runs of one call).",
        "",
        "| call | runs | step err mean % | about the mean, rms % |",
        "| --- | ---: | ---: | ---: |",
    ]
    for call in calls:
        errs = [
            r["step_error_pct"] for r in rows if r["call"] == call and r["metric"] == METRICS[0]
        ]
        if errs:
            level = statistics.mean(errs)
            lines.append(
                f"| {call} | {len(errs)} | {level:+.1f} | {rms([e - level for e in errs]):.1f} |"
            )
    lines += [
        "",
        "Over every run and call, per metric: rms of the error, and of what is left "
        "once the amplified step error is taken out.",
        "",
        "| metric | runs | error % | left % |",
        "| --- | ---: | ---: | ---: |",
    ]
    for m in METRICS:
        rs = [r for r in rows if r["metric"] == m]
        if rs:
            lines.append(
                f"| {m} | {len(rs)} | {rms([r['error_pct'] for r in rs]):.2f} | "
                f"{rms([r['residual_pct'] for r in rs]):.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument(
        "--profile", type=Path, default=None, help="default: the shipped profile of --model"
    )
    ap.add_argument(
        "--scale",
        type=float,
        default=0.02,
        help="steps priced 1 - s and 1 + s times the profile's (default 0.02)",
    )
    ap.add_argument("--out", type=Path, default=None, help="writes <out>.md and <out>.csv")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    if not 0 < args.scale < 0.5:
        raise SystemExit(f"--scale {args.scale}: must be in (0, 0.5)")
    profile = args.profile or SHIPPED / args.model
    runner = shipped_runner(args.model)
    calls = call_runs(args.model, runner, skip=SKIP - PARTIAL)
    if not calls:
        raise SystemExit(f"no stored real runs of {args.model!r} by its shipped profile's runner")
    work = [(call, f, profile, args.scale) for call, d in calls for f in real_run_files(d)]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = [r for rs in pool.map(run_rows, work) for r in rs]
    shown = profile.resolve()
    shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else profile
    text = markdown(args.model, shown, args.scale, rows, [c for c, _ in calls])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{args.out}.md").write_text(text, encoding="utf-8")
        with open(f"{args.out}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
