"""How the calibrated cost model prices the shared-prefix steps of `shared_groups.py` (no GPU).

For every row of results/validation/shared_groups.csv (a step over shared prefix blocks and
its reference over distinct blocks, timed in the same rounds), the model's ratio of the two,
with the step's shared tokens (tokens of blocks that two or more of its sequences hold, once
per reading sequence), against the measured ratio; the rms error per kind of row.

    python benchmarks/shared_groups_report.py [--rows results/validation/shared_groups.csv]
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter

import numpy as np
from shared_groups import shapes

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="results/validation/shared_groups.csv")
    ap.add_argument("--profiles", default="calibration/h200")
    args = ap.parse_args()
    by_label = {s[0]: s for s in shapes(16)}
    rows = list(csv.DictReader(open(args.rows)))
    for model in sorted({r["model"] for r in rows}):
        cm = CalibratedCostModel(Profile.load(f"{args.profiles}/{model}"))
        errors: dict[str, list[float]] = {}
        for r in rows:
            if r["model"] != model:
                continue
            _, ctx, groups, prefix, news = by_label[r["label"]]
            members = Counter(groups)
            shared = sum(prefix[g] for g in groups if g >= 0 and members[g] >= 2)
            dec = [c for c, n in zip(ctx, news, strict=True) if n == 1]
            pre = [(c, n) for c, n in zip(ctx, news, strict=True) if n > 1]

            def device_s(shared_tokens: int | None, cm=cm, dec=dec, pre=pre) -> float:
                return cm.device_time(
                    BatchShape(
                        16,
                        len(dec) + sum(n for _, n in pre),
                        len(dec),
                        sum(dec),
                        dec,
                        [n for _, n in pre],
                        [c for c, _ in pre],
                        shared_context_tokens=shared_tokens,
                    )
                )

            predicted = device_s(shared) / device_s(None)
            kind = r["label"].split(" b=")[0]
            errors.setdefault(kind, []).append(predicted / float(r["ratio"]) - 1.0)
            print(
                f"{model} {r['label']:38} measured {float(r['ratio']):.3f} "
                f"predicted {predicted:.3f}"
            )
        for kind, e in errors.items():
            print(
                f"{model} {kind}: {len(e)} rows, ratio error mean {100 * np.mean(e):+.1f} %, "
                f"rms {100 * np.sqrt(np.mean(np.square(e))):.1f} %"
            )


if __name__ == "__main__":
    main()
