"""Why real steps and calibrated steps disagree: the two speeds of a launch-bound eager step.

Reads the stored real runs of the eager runner (results/validation/eager/real/<model>/) and the
H200 profiles they were predicted with (results/validation/eager/profile/h200/llama-2-7b,
results/validation/eager/profile/h200/llama-3-8b) and measures, without a GPU (the CUDA-graph runs have no
launch-bound floor, so "slow" would only mean a larger batch there: benchmarks/graph_steps.py
compares them with the profile step by step instead):

- per real run, decode-only steps with fewer than 64 requests (launch-bound: the GPU work is
  a third of the step): the fast-mode time (25th percentile), the share of "slow" steps
  (> 1.35 x that), how slow steps cluster in time (lag-1 autocorrelation of the slow flag),
  and the slow share by steps since the last step that carried prefill tokens;
- per profile, decode rows with batch <= 32: how many sit in the slow cluster.

    python benchmarks/step_regimes.py   -> results/validation/step_regimes.{json,md}
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from pagesim.validate import read_json_file, real_run_files

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "validation"
# (runner, real runs, profile roots searched in order for <gpu>/<model>/decode.csv)
SOURCES = (("eager", OUT / "eager" / "real", (OUT / "eager" / "profile" / "h200",)),)
SLOW = 1.35  # a step slower than this multiple of the run's fast-mode time is "slow"
SINCE_BINS = ((1, 10), (10, 30), (30, 100), (100, 10**9))


def run_stats(path: Path) -> dict:
    doc = read_json_file(path)
    st = doc["records"]["steps"]
    n = np.asarray(st["num_reqs"])
    tok = np.asarray(st["num_tokens"])
    ex = np.asarray(st["execute_s"]) * 1e3
    prefill = tok > n
    since = np.zeros(len(n), dtype=np.int64)
    count = 10**9
    for i, p in enumerate(prefill):
        count = 0 if p else count + 1
        since[i] = count
    sel = ~prefill & (n < 64)
    if sel.sum() < 20:
        return {"run": path.name.split(".")[0], "num_steps": int(sel.sum())}
    fast = float(np.percentile(ex[sel], 25))
    slow = ex > SLOW * fast
    flag = slow[sel].astype(float)
    flag -= flag.mean()
    ac = float((flag[:-1] * flag[1:]).mean() / flag.var()) if flag.var() > 0 else 0.0
    by_since = {}
    for lo, hi in SINCE_BINS:
        m = sel & (since >= lo) & (since < hi)
        if m.sum() >= 10:
            by_since[f"{lo}-{hi if hi < 10**9 else 'inf'}"] = round(float(slow[m].mean()), 3)
    return {
        "run": path.name.split(".")[0],
        "num_steps": int(sel.sum()),
        "fast_ms": round(fast, 2),
        "median_ms": round(float(np.median(ex[sel])), 2),
        "mean_ms": round(float(ex[sel].mean()), 2),
        "slow_share": round(float(slow[sel].mean()), 3),
        "slow_lag1_autocorr": round(ac, 2),
        "slow_share_by_steps_since_prefill": by_since,
    }


def profile_stats(path: Path) -> dict:
    rows = list(csv.DictReader(path.open()))
    out = {}
    for bs in sorted({int(r["block_size"]) for r in rows}):
        t = np.array(
            [
                float(r["step_time_ms"])
                for r in rows
                if int(r["block_size"]) == bs and int(r["batch_size"]) <= 32
            ]
        )
        fast = float(np.percentile(t, 25))
        out[bs] = {
            "rows": len(t),
            "fast_ms": round(fast, 2),
            "slow_rows": int((t > SLOW * fast).sum()),
        }
    return out


def main() -> None:
    doc = {"slow_threshold": SLOW, "runs": {}, "profiles": {}}
    for runner, real, roots in SOURCES:
        for model_dir in sorted(p for p in real.iterdir() if p.is_dir()):
            key = f"{model_dir.name} ({runner})"
            doc["runs"][key] = [run_stats(p) for p in real_run_files(model_dir)]
            prof = next(
                (
                    r / model_dir.name / "decode.csv"
                    for r in roots
                    if (r / model_dir.name / "decode.csv").is_file()
                ),
                None,
            )
            if prof is not None:
                doc["profiles"][key] = profile_stats(prof)
    (OUT / "step_regimes.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "| model (runner) | run | decode steps (<64 reqs) | fast ms | median ms | mean ms | slow share "
        "| lag-1 autocorr | slow share by steps since prefill |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for model, runs in doc["runs"].items():
        for r in runs:
            if "fast_ms" not in r:
                continue
            lines.append(
                f"| {model} | {r['run']} | {r['num_steps']} | {r['fast_ms']} | "
                f"{r['median_ms']} | {r['mean_ms']} | {r['slow_share']} | "
                f"{r['slow_lag1_autocorr']} | "
                + ", ".join(f"{k}: {v}" for k, v in r["slow_share_by_steps_since_prefill"].items())
                + " |"
            )
    lines += [
        "",
        "| model (runner) | block size | decode rows (batch <= 32) | fast ms | rows in the slow "
        "cluster |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for model, per_bs in doc["profiles"].items():
        for bs, s in per_bs.items():
            lines.append(f"| {model} | {bs} | {s['rows']} | {s['fast_ms']} | {s['slow_rows']} |")
    (OUT / "step_regimes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
