"""How far the calls' calibrations of one model disagree on the same decode steps (no GPU).

Every GPU call of a runner calibrates the same decode grid. Its rows at one block size are
the same shapes (batch, context) in every call, so each profile's row is compared with the
median of all the runner's profiles at that shape. The ratio, less one, is summarised per
profile and batch size (median over the contexts).

The served steps of these calls took the same device time within about 2 % from call to call
(`results/validation/host_in_step_<model>_staged.md`), so where a profile sits well above or
below the others it prices its runs' steps off by about as much, whichever call served them.
That is the spread against which the 3 % targets are met.

    python benchmarks/profile_spread.py --model llama-2-7b --out results/validation/profile_spread_llama-2-7b

Prints a markdown table; with --out writes it and a CSV.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from gpu_calls import call_profiles, shipped_runner

from pagesim.cost.profile import Profile

Shape = tuple[int, int]


def decode_rows(profile: Path, block_size: int) -> dict[Shape, float]:
    """(batch, context) -> median step time in ms, of a profile's decode table at one block
    size."""
    return {
        (r.batch_size, r.context_len): r.step_time_ms
        for r in Profile.load(profile).decode
        if r.block_size == block_size
    }


def spread(tables: dict[str, dict[Shape, float]]) -> dict[str, dict[int, float]]:
    """Per profile and batch size: the median over contexts of (row / median of all profiles'
    rows at that shape - 1), in %, over the shapes every profile has."""
    shared = set.intersection(*(set(t) for t in tables.values()))
    middle = {k: statistics.median(t[k] for t in tables.values()) for k in shared}
    out = {}
    for name, t in tables.items():
        by_batch: dict[int, list[float]] = defaultdict(list)
        for k in shared:
            by_batch[k[0]].append(100 * (t[k] / middle[k] - 1))
        out[name] = {b: statistics.median(v) for b, v in sorted(by_batch.items())}
    return out


def report(model: str, block_size: int, result: dict[str, dict[int, float]]) -> str:
    """Markdown: one row per profile, one column per batch size, and the profile's range."""
    batches = sorted({b for row in result.values() for b in row})
    lines = [
        f"{model}, block {block_size}: each call's decode row against the median of the "
        f"runner's {len(result)} profiles at the same (batch, context), % (median over "
        "contexts)",
        "",
        "| profile | " + " | ".join(f"batch {b}" for b in batches) + " | range |",
        "| --- | " + " | ".join("---:" for _ in batches) + " | --- |",
    ]
    for name, row in result.items():
        vals = [row[b] for b in batches]
        lines.append(
            f"| {name} | "
            + " | ".join(f"{v:+.1f}" for v in vals)
            + f" | {min(vals):+.1f} to {max(vals):+.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--out", help="stem of the markdown and CSV outputs (default: print only)")
    args = ap.parse_args()
    runner = shipped_runner(args.model)
    profiles = call_profiles(args.model, runner)
    if len(profiles) < 2:
        raise SystemExit(f"{args.model}: fewer than two calls of the runner {runner!r}")
    tables = {name: decode_rows(p, args.block_size) for name, p in profiles.items()}
    result = spread(tables)
    text = report(args.model, args.block_size, result)
    print(text, end="")
    if args.out:
        Path(f"{args.out}.md").write_text(text)
        with open(f"{args.out}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "block_size", "profile", "batch_size", "vs_median_pct"])
            for name, row in result.items():
                for b, v in row.items():
                    w.writerow([args.model, args.block_size, name, b, f"{v:.3f}"])


if __name__ == "__main__":
    main()
