"""How many calibrations the median needs: a held-out call's targets against the number of
calibrations folded into the median (no GPU).

The shipped profile is the median of several GPU calls' calibrations (`pagesim
merge-profiles`), because one call's calibration carries that call's level, a few % off the
next call's. How many calls are enough? For each call of the runner with real runs, and each
k from 1 to the number of other calls' calibrations, every k-subset of the other calls'
profiles is merged and priced on the held-out call's runs. Per k: the targets met as a share
of the held-out call's, mean, worst and best over (held-out call, subset). k = 1 is shipping
one other call's profile chosen blindly; the last k is the median of all the others.

    python benchmarks/median_of_k.py --model llama-2-7b \\
        [--out results/validation/median_of_k_llama-2-7b]

Prints the table; with --out writes it as markdown and every (call, subset) as CSV.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from concurrent.futures import ProcessPoolExecutor
from itertools import combinations
from pathlib import Path

from gpu_calls import call_profiles, folder_of, real_runs, shipped_runner
from grid_ablation import targets_met
from profile_choice import merged


def subsets(model: str, runner: str) -> list[tuple[str, tuple[str, ...]]]:
    """(held-out call, the other calls whose profiles are merged) for every call with runs and
    every non-empty subset of the other calls' profiles."""
    calls = sorted({folder_of(r) for r in real_runs(model, runner)})
    profiles = sorted(call_profiles(model, runner))
    out = []
    for call in calls:
        others = [p for p in profiles if p != call]
        for k in range(1, len(others) + 1):
            out += [(call, subset) for subset in combinations(others, k)]
    return out


def score(model: str, runner: str, scratch: Path) -> list[dict[str, object]]:
    """One row per (held-out call, subset): k, targets met and targets on the call's runs."""
    profiles = call_profiles(model, runner)
    runs = real_runs(model, runner)
    cases = subsets(model, runner)
    merged_dirs = {
        subset: merged([profiles[c] for c in subset], scratch / "+".join(subset))
        for subset in sorted({s for _, s in cases})
    }
    jobs = [(call, subset, run) for call, subset in cases for run in runs if folder_of(run) == call]
    with ProcessPoolExecutor(2) as pool:
        results = list(
            pool.map(targets_met, [(run, merged_dirs[s]) for _, s, run in jobs], chunksize=16)
        )
    rows: dict[tuple[str, tuple[str, ...]], dict[str, object]] = {}
    for (call, subset, _), (met, total) in zip(jobs, results, strict=True):
        row = rows.setdefault(
            (call, subset),
            {"call": call, "k": len(subset), "subset": " ".join(subset), "met": 0, "targets": 0},
        )
        row["met"] += met
        row["targets"] += total
    return list(rows.values())


def report(model: str, rows: list[dict[str, object]]) -> str:
    """Per k: the held-out call's targets met, %, mean / worst / best over (call, subset)."""
    calls = sorted({r["call"] for r in rows})
    lines = [
        f"{model}: targets met on a held-out call by the median of k other calls' "
        f"calibrations ({len(calls)} held-out calls), % of the call's targets.",
        "",
        "| k | cases | mean % | worst % | best % |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in sorted({r["k"] for r in rows}):
        share = [100 * r["met"] / r["targets"] for r in rows if r["k"] == k]
        lines.append(
            f"| {k} | {len(share)} | {sum(share) / len(share):.1f} | "
            f"{min(share):.1f} | {max(share):.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", help="stem of the markdown and CSV outputs (default: print only)")
    args = ap.parse_args()
    runner = shipped_runner(args.model)
    if runner is None or not real_runs(args.model, runner):
        raise SystemExit(f"no stored real runs of {args.model!r} by its shipped profile's runner")
    with tempfile.TemporaryDirectory() as scratch:
        rows = score(args.model, runner, Path(scratch))
    text = report(args.model, rows)
    print(text)
    if args.out:
        Path(f"{args.out}.md").write_text(text, encoding="utf-8")
        with open(f"{args.out}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=["call", "k", "subset", "met", "targets"])
            w.writeheader()
            w.writerows(sorted(rows, key=lambda r: (r["call"], r["k"], r["subset"])))


if __name__ == "__main__":
    main()
