"""The analytical model against measured GPU-bound steps, on one GPU and at TP 2 (no GPU).

    python benchmarks/analytical_vs_measured.py [--out results/analytical_vs_measured.csv]

Models without a calibration profile (llama-3-70b at any TP size) are priced by the
analytical roofline, whose efficiencies are assumptions. The measured prefill rows of 1,024
new tokens or more are bound by the GPU on every profile here (at TP 2 too, where shorter
steps are bound by the eager runner's host: `docs/tensor_parallel.md`), so they say how far the
roofline is from the hardware, and whether its TP terms (sharding, two all-reduces per layer)
add an error of their own: the one-GPU profiles (`calibration/h200/<model>/`, block 16) and
the TP-2 profile measured on 2 x H200 (`results/validation/tp2/`). Prints a table; writes CSV.
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


def rows_for(model: str, tp: int, path: Path) -> list[dict]:
    config = EngineConfig.create(model=model, gpu="h200", tensor_parallel_size=tp)
    cm = AnalyticalCostModel(config.model_spec, config.gpu_spec, tensor_parallel_size=tp)
    out = []
    for r in Profile.load(path).prefill:
        if r.block_size != 16 or r.num_new_tokens < MIN_NEW_TOKENS:
            continue
        shape = BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens)
        predicted = 1e3 * cm.step_time(shape)
        out.append({"model": model, "tp": tp, "new_tokens": r.num_new_tokens,
                    "cached_tokens": r.num_cached_tokens,
                    "measured_ms": round(r.step_time_ms, 2),
                    "analytical_ms": round(predicted, 2),
                    "error_pct": round(100 * (predicted / r.step_time_ms - 1), 1)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/analytical_vs_measured.csv")
    a = ap.parse_args()
    rows = [row for model, tp, path in PROFILES for row in rows_for(model, tp, path)]
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    for model, tp, _ in PROFILES:
        errs = np.array([r["error_pct"] for r in rows if r["model"] == model])
        print(f"{model} TP {tp}: {len(errs)} rows, analytical error {errs.min():+.1f} to "
              f"{errs.max():+.1f} % (median {np.median(errs):+.1f} %)")
    with open(a.out, "w", newline="") as f:
        for model, tp, path in PROFILES:  # where each measurement comes from
            m = Profile.load(path).metadata
            f.write(f"# {model} TP {tp}: {path.relative_to(ROOT)}, {m.gpu_name}, driver "
                    f"{m.driver}, torch {m.torch}, triton {m.triton}, {m.date}\n")
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
