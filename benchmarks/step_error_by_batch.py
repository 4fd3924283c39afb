"""Where a real run's steps depart from the profile's price: decode-only steps by batch size.

For each decode-only step a real run recorded (`records.runner_steps`: running requests,
their summed context, the runner's wall time), prices the same shape with the calibrated
model (`BatchShape.decode` at the mean context) and prints, per batch-size bin, the steps,
the real and priced median times and the median of real / priced. A run-level TPOT error
says that a model misses; this says at which batch sizes (no GPU).

    python benchmarks/step_error_by_batch.py \\
        results/out_of_sample/2026-12-02-moe-r4/real/qwen3-30b-a3b/chat-50pct-bs16.json.xz
    python benchmarks/step_error_by_batch.py RUN --profile DIR --csv OUT.csv
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.data import calibration_dir
from pagesim.validate.store import read_real_run, real_run_config

#: Lower edges of the batch-size bins.
BINS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def bin_of(batch: int) -> int:
    return max(b for b in BINS if b <= batch)


def rows(run: Path, profile: Path | None) -> list[dict]:
    doc = read_real_run(run)
    config = real_run_config(doc)
    prof = Profile.load(profile or calibration_dir() / "h200" / config.model)
    model = CalibratedCostModel(prof)
    steps = (doc.get("records") or {}).get("runner_steps")
    if steps is None:
        raise SystemExit(f"{run}: the run was stored without its per-step records")
    by_bin: dict[int, list[tuple[float, float]]] = {}
    for b, prefill, ctx, wall in zip(
        steps["num_reqs"],
        steps["num_prefill_tokens"],
        steps["context_sum"],
        steps["wall_s"],
        strict=True,
    ):
        if prefill or not b:
            continue
        priced = model.step_time(BatchShape.decode(b, ctx // b, config.block_size))
        by_bin.setdefault(bin_of(b), []).append((wall * 1e3, priced * 1e3))
    return [
        {
            "batch_from": k,
            "steps": len(v),
            "real_ms": round(statistics.median(r for r, _ in v), 3),
            "priced_ms": round(statistics.median(p for _, p in v), 3),
            "real_over_priced": round(statistics.median(r / p for r, p in v), 3),
        }
        for k, v in sorted(by_bin.items())
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a stored real run (.json.xz)")
    ap.add_argument("--profile", type=Path, help="profile folder (default: the shipped one)")
    ap.add_argument("--csv", type=Path, help="also write the table here")
    args = ap.parse_args()
    table = rows(args.run, args.profile)
    print("| batch from | steps | real ms | priced ms | real / priced |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in table:
        print(
            f"| {r['batch_from']} | {r['steps']} | {r['real_ms']:.2f} | {r['priced_ms']:.2f} "
            f"| {r['real_over_priced']:.3f} |"
        )
    if args.csv:
        with args.csv.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(table[0]) if table else ["batch_from"])
            w.writeheader()
            w.writerows(table)


if __name__ == "__main__":
    main()
