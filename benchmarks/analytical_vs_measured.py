"""The analytical model against measured GPU-bound steps, on one GPU and at TP 2 (no GPU).

    python benchmarks/analytical_vs_measured.py [--out results/analytical_vs_measured.csv]

Models without a calibration profile (llama-3-70b at any TP size) are priced by the
analytical roofline, whose efficiencies are assumptions. The measured prefill rows of 1,024
new tokens or more are bound by the GPU on every profile here (at TP 2 too, where shorter
steps are bound by the eager runner's host: `docs/tensor_parallel.md`), so they say how far the
roofline is from the hardware, and whether its TP terms (sharding, two all-reduces per layer)
add an error of their own: the one-GPU profiles (`calibration/h200/<model>/`, block 16) and
the TP-2 profile measured on 2 x H200 (`results/validation/tp2/`).

Then one factor on the roofline's compute terms (linear, attention, paged blocks), fitted on the
one-GPU rows alone (the median of (measured - other terms) / compute terms), is applied to every
row: how close the TP-2 rows come is how well the TP terms transfer once the efficiency is
right. Prints a table; writes CSV.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
PROFILES = (("llama-2-7b", 1, ROOT / "calibration" / "h200" / "llama-2-7b"),
            ("llama-3-8b", 1, ROOT / "calibration" / "h200" / "llama-3-8b"),
            ("llama-3-70b", 2, ROOT / "results" / "validation" / "tp2" / "profile" / "h200"
             / "llama-3-70b-tp2"))
MIN_NEW_TOKENS = 1024


COMPUTE = ("linear", "attention", "paged_blocks")


def rows_for(model: str, tp: int, path: Path) -> list[dict]:
    config = EngineConfig.create(model=model, gpu="h200", tensor_parallel_size=tp)
    cm = AnalyticalCostModel(config.model_spec, config.gpu_spec, tensor_parallel_size=tp)
    out = []
    for r in Profile.load(path).prefill:
        if r.block_size != 16 or r.num_new_tokens < MIN_NEW_TOKENS:
            continue
        parts = cm.step_time_breakdown(BatchShape.prefill(r.num_new_tokens,
                                                          r.num_cached_tokens))
        predicted = 1e3 * sum(parts.values())
        compute = 1e3 * sum(parts[k] for k in COMPUTE)
        out.append({"model": model, "tp": tp, "new_tokens": r.num_new_tokens,
                    "cached_tokens": r.num_cached_tokens,
                    "measured_ms": round(r.step_time_ms, 2),
                    "analytical_ms": round(predicted, 2),
                    "error_pct": round(100 * (predicted / r.step_time_ms - 1), 1),
                    "allreduce_ms": round(1e3 * parts["allreduce"], 2),
                    "_compute": compute, "_other": predicted - compute,
                    "_measured": r.step_time_ms})
    return out


def scale_compute(rows: list[dict]) -> float:
    """The factor on the compute terms that the one-GPU rows want (their median)."""
    one = [r for r in rows if r["tp"] == 1]
    return float(np.median([(r["_measured"] - r["_other"]) / r["_compute"] for r in one]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/analytical_vs_measured.csv")
    a = ap.parse_args()
    rows = [row for model, tp, path in PROFILES for row in rows_for(model, tp, path)]
    k = scale_compute(rows)
    for r in rows:
        scaled = r["_other"] + k * r["_compute"]
        r["scaled_ms"] = round(scaled, 2)
        r["scaled_error_pct"] = round(100 * (scaled / r["_measured"] - 1), 1)
    cols = [c for c in rows[0] if not c.startswith("_")]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"compute terms x {k:.3f} (fitted on the one-GPU rows)")
    for model, tp, _ in PROFILES:
        for key, what in (("error_pct", "analytical"), ("scaled_error_pct", "scaled")):
            errs = np.array([r[key] for r in rows if r["model"] == model])
            print(f"{model} TP {tp}: {len(errs)} rows, {what} error {errs.min():+.1f} to "
                  f"{errs.max():+.1f} % (median {np.median(errs):+.1f} %)")
    with open(a.out, "w", newline="") as f:
        for model, tp, path in PROFILES:  # where each measurement comes from
            m = Profile.load(path).metadata
            f.write(f"# {model} TP {tp}: {path.relative_to(ROOT)}, {m.gpu_name}, driver "
                    f"{m.driver}, torch {m.torch}, triton {m.triton}, {m.date}\n")
        f.write(f"# scaled: other terms + {k:.3f} x compute terms, the factor fitted on the "
                "one-GPU rows\n")
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
