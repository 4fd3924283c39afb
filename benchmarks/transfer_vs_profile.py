"""The transfer cost model against a profile measured on its target GPU, step by step (no GPU).

A `pagesim calibrate` run on another GPU than the source (an H100, say) measures the same
grid that the shipped H200 profile holds. For every decode, prefill and mixed row of that
profile, this prices the row's shape three ways and compares each with the measured step:

- the transfer model (`pagesim.cost.transfer`, the shipped H200 profile carried to the
  profile's GPU), its step and its parts (the `other` and `attention` it carries);
- the shipped H200 profile as it is (how far apart the two GPUs really are);
- the measured ratio target / H200 against the ratio the transfer applies.

Prints medians per kind, block size and token bin, then per kind, and writes one CSV row
per grid row.

    python benchmarks/transfer_vs_profile.py \
        results/out_of_sample/2026-12-07-h100-calibrated/profile/h100-sxm/llama-3-8b
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from pathlib import Path

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.cost.profile import Profile
from pagesim.cost.profile_rows import row_batch, row_shapes
from pagesim.cost.transfer import SOURCE_GPU, transfer_source_dir
from pagesim.data import calibration_dir
from pagesim.sim.build import transferred_cost_model

MS = 1e-3
BINS = (1, 4, 16, 64, 256, 1 << 30)


def shape_of(kind: str, row) -> BatchShape | None:
    """The step a profile row timed (None for a row no single shape describes)."""
    if kind == "decode":
        return BatchShape.decode(row.batch_size, row.context_len, row.block_size)
    return row_batch(kind, row)


def size_bin(tokens: int) -> tuple[int, str]:
    """(order, label) of the token-count bin of a step."""
    for i, (lo, hi) in enumerate(zip(BINS, BINS[1:], strict=False)):
        if lo <= tokens < hi:
            return i, f"{lo}-{hi - 1}" if hi < 1 << 30 else f">={lo}"
    return len(BINS), "?"


def compare(directory: Path) -> list[dict]:
    measured = Profile.load(directory)
    meta = measured.metadata
    config = EngineConfig(
        model=meta.model, gpu=meta.gpu, tensor_parallel_size=meta.tensor_parallel_size
    )
    source = transfer_source_dir(calibration_dir(), meta.model, meta.tensor_parallel_size)
    if source is None or meta.gpu == SOURCE_GPU:
        raise SystemExit(f"{meta.gpu}/{meta.model}: no shipped profile of another GPU to carry")
    transfer = transferred_cost_model(config, source)
    h200 = transfer.source
    rows = []
    for kind, tokens, row in row_shapes(measured):
        shape = shape_of(kind, row)
        if shape is None:
            continue
        parts = transfer.step_time_breakdown(shape)
        src = h200.step_time_breakdown(shape)
        carried = sum(parts.values()) - parts["host_overhead"]
        on_source = sum(src.values()) - src["host_overhead"]
        real = row.step_time_ms * MS
        rows.append(
            {
                "kind": kind,
                "block_size": row.block_size,
                "tokens": tokens,
                "bin": size_bin(tokens)[1],
                "bin_order": size_bin(tokens)[0],
                "measured_ms": row.step_time_ms,
                "measured_other_ms": row.other_ms,
                "measured_attention_ms": row.attention_ms,
                "transfer_ms": carried / MS,
                "transfer_other_ms": parts["other"] / MS,
                "transfer_attention_ms": parts["attention"] / MS,
                "source_ms": on_source / MS,
                "transfer_error_pct": 100 * (carried / real - 1),
                "real_ratio": real / on_source,
                "transfer_ratio": carried / on_source,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path, help="a profile directory measured on the target GPU")
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    rows = compare(args.profile)
    if not rows:
        raise SystemExit(f"{args.profile}: no decode, prefill or mixed row to compare")
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["kind"], r["block_size"], (r["bin_order"], r["bin"]))].append(r)
    print(
        "| kind | block | tokens | rows | transfer error (median) | real ratio | transfer ratio |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for (kind, bs, (_, tokens)), mine in sorted(groups.items()):
        error, real, carried = (
            statistics.median(r[key] for r in mine)
            for key in ("transfer_error_pct", "real_ratio", "transfer_ratio")
        )
        print(
            f"| {kind} | {bs} | {tokens} | {len(mine)} | {error:+.1f} % | {real:.3f} "
            f"| {carried:.3f} |"
        )
    print()
    for kind in sorted({r["kind"] for r in rows}):
        errors = [r["transfer_error_pct"] for r in rows if r["kind"] == kind]
        print(
            f"{kind}: {len(errors)} rows, transfer error median {statistics.median(errors):+.1f} %"
        )
    errors = [abs(r["transfer_error_pct"]) for r in rows]
    print(f"{len(rows)} rows; transfer median |error| {statistics.median(errors):.1f} %")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
