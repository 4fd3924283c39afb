"""How the calibrated cost model prices the steps of `varlen_spread.py` (no GPU).

For every row of results/validation/varlen_spread.csv (a mixed step whose decodes have unequal
contexts and its uniform twin, timed in the same rounds), the model's ratio of the two device
times (host overhead left out) against the measured one.

    python benchmarks/varlen_spread_report.py [--rows results/validation/varlen_spread.csv]
"""

from __future__ import annotations

import argparse
import csv

import numpy as np
from varlen_spread import contexts

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile


def device_time(model: CalibratedCostModel, ctx: list[int], q: int) -> float:
    return model.device_time(BatchShape(16, len(ctx) + q, len(ctx), sum(ctx), list(ctx), [q], [0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="results/validation/varlen_spread.csv")
    ap.add_argument("--profiles", default="calibration/h200")
    args = ap.parse_args()
    with open(args.rows) as f:
        rows = list(csv.DictReader(row for row in f if not row.startswith("#")))
    models: dict[str, CalibratedCostModel] = {}
    errors: dict[str, list[float]] = {}
    print(
        "| model | decodes | mean context | new tokens | measured ratio | predicted | "
        "error % |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for r in rows:
        name = r["model"]
        if name not in models:
            models[name] = CalibratedCostModel(Profile.load(f"{args.profiles}/{name}"))
        d, c, q = int(r["decodes"]), int(r["mean_context"]), int(r["new_tokens"])
        model = models[name]
        predicted = device_time(model, contexts(d, c, True), q) / device_time(
            model, contexts(d, c, False), q
        )
        measured = float(r["ratio"])
        err = 100 * (predicted / measured - 1)
        errors.setdefault(name, []).append(err)
        print(f"| {name} | {d} | {c} | {q} | {measured:.3f} | {predicted:.3f} | {err:+.1f} |")
    for name, e in errors.items():
        a = np.asarray(e)
        print(
            f"{name}: ratio error mean {a.mean():+.1f} %, rms {np.sqrt((a**2).mean()):.1f} %"
            f" over {len(a)} rows"
        )


if __name__ == "__main__":
    main()
