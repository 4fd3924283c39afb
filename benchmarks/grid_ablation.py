"""What parts of the calibration grid buy: validation targets met by one profile with rows held out.

A profile's rows are measured; some exist only because the grid was widened (decode rows at
CUDA-graph sizes 8, 24 and 48; decode_spread rows whose uniform twin runs in the same span
bucket). Each variant here is the same profile with one set of rows removed, so the
comparison is free of the few-percent level shift between GPU calls that comparing two
calibrations would carry. Every variant prices every stored real run of the model
(`results/validation/**/real/<model>/`) served by the runner the profile measured
(`gpu_calls.py`), and counts the validation targets met (`pagesim validate`'s rule).

    python benchmarks/grid_ablation.py --profile results/validation/spread_twins/profile/h200/qwen2.5-7b \\
        --model qwen2.5-7b [--out results/validation/spread_twins/ablation_qwen2.5-7b.csv]

Prints a table (variants by the folder of runs they were priced on) and writes the CSV.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpu_calls import RESULTS, folder_of, profile_runner_label, real_runs

from pagesim.validate import validate_real_run

#: the decode batches the grid gained (every CUDA-graph size up to 64 but 2)
NEW_BATCHES = {8, 24, 48}
#: the mean context of the spread points whose twin runs in another span bucket
CROSS_BUCKET_MEAN = 1800

Keep = Callable[[dict[str, str]], bool]


def _cross_bucket(row: dict[str, str]) -> bool:
    return int(row["context_len"]) == CROSS_BUCKET_MEAN


def _old_batch(row: dict[str, str]) -> bool:
    return int(row["batch_size"]) not in NEW_BATCHES


# variant -> (decode_spread rows kept, decode rows kept); None keeps every row
VARIANTS: dict[str, tuple[Keep | None, Keep | None]] = {
    "all rows": (None, None),
    "spread: cross-bucket twins only": (_cross_bucket, None),
    "spread: same-bucket twins only": (lambda r: not _cross_bucket(r), None),
    "no decode rows at 8, 24, 48": (None, _old_batch),
    "former grid (both removed)": (_cross_bucket, _old_batch),
}


def _filter(path: Path, keep: Keep) -> tuple[int, int]:
    """Drops the rows `keep` rejects; returns (rows before, rows after)."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    kept = [r for r in rows if keep(r)]
    if rows:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(kept)
    return len(rows), len(kept)


def targets_met(args: tuple[Path, Path]) -> tuple[int, int]:
    """(targets met, targets) of one stored run priced with one profile."""
    rows = validate_real_run(*args)["rows"]
    return sum(r["met"] for r in rows), len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runner = profile_runner_label(args.profile)
    runs = real_runs(args.model, runner) if runner else []
    if not runs:
        raise SystemExit(
            f"no stored real runs of {args.model!r} by the profile's runner "
            f"({runner}) under {RESULTS}"
        )
    folders = sorted({folder_of(r) for r in runs})
    table: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(2) as pool:
        for name, (spread, decode) in VARIANTS.items():
            prof = Path(tmp) / name.replace(" ", "_").replace(",", "").replace(":", "")
            shutil.copytree(args.profile, prof)
            changes = [
                _filter(prof / table, keep)
                for table, keep in (("decode_spread.csv", spread), ("decode.csv", decode))
                if keep
            ]
            if changes and all(before == after for before, after in changes):
                print(f"{name:34s} skipped: the profile has no such rows to remove")
                continue
            if any(before and not after for before, after in changes):
                print(f"{name:34s} skipped: the profile has no rows of the other kind")
                continue
            counts = {g: [0, 0] for g in folders}
            for run, (met, total) in zip(
                runs, pool.map(targets_met, [(r, prof) for r in runs]), strict=True
            ):
                counts[folder_of(run)][0] += met
                counts[folder_of(run)][1] += total
            row: dict[str, object] = {"variant": name}
            row.update({g: f"{a}/{b}" for g, (a, b) in counts.items()})
            row["met"] = sum(a for a, _ in counts.values())
            row["targets"] = sum(b for _, b in counts.values())
            table.append(row)
            print(
                f"{name:34s} {row['met']}/{row['targets']}  "
                + " ".join(f"{g}:{row[g]}" for g in folders),
                flush=True,
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            f.write(f"# profile: {args.profile}; model: {args.model}; {len(runs)} runs\n")
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
