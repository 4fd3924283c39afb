"""Block-table rows in the calibration's timed calls against a served step's (no GPU).

The graph path keeps one block-table row per request id (`BlockTableRows`); a served decode
step finds its requests' rows in place and writes only a block every block_size steps. The
calibration times its grid points in interleaved rounds (`measure_interleaved`), so if the
points share request ids, every timed call finds the rows another point left and rewrites
them, a host cost the served steps it prices do not pay. This replays the calibration's own
order over its own synthetic steps (`calibration_entries`, `synthetic_step`, llama-3-8b at
block 16, three rounds after the warm-up) on `BlockTableRows` alone, with one set of
request ids for all points and with ids of each point's own (`calibrate_block_size` now),
and reports the share of a timed call's rows that had to be rewritten, by kind of point;
then times `row_index` for 128 rows of 64 blocks found in place and rewritten.

    python benchmarks/calibration_rows.py [--out results/calibration_rows.csv]
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np
from host_csv import write_host_csv

from pagesim.config import EngineConfig
from pagesim.gpu.calibrate import (
    BlockSource,
    CalibrationGrid,
    calibration_entries,
    grid_points,
    round_order_rng,
)
from pagesim.gpu.input_buffers import BlockTableRows

MODEL = "llama-3-8b"
BLOCK_SIZE = 16
ROUNDS = 3
GRAPH_TOKENS = 512  # steps larger than this run eagerly and build no rows


def rewritten_share(own_ids: bool, seed: int = 0) -> dict[str, float]:
    """Per kind of point: the mean share of a timed call's rows that were rewritten."""
    cfg = EngineConfig.create(model=MODEL, gpu="h200", block_size=BLOCK_SIZE)
    blocks = 57_435  # llama-3-8b's measured blocks at block 16 on the H200
    entries = calibration_entries(
        CalibrationGrid(),
        BLOCK_SIZE,
        max_model_len=cfg.max_model_len,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_num_seqs=cfg.max_num_seqs,
        full=True,
        capacity=(blocks - 1) * BLOCK_SIZE,
    )
    points = [
        (kind, out)
        for kind, _, out, _ in grid_points(entries, BLOCK_SIZE, BlockSource(blocks, seed), own_ids)
        if out.total_num_scheduled_tokens <= GRAPH_TOKENS
    ]
    width = -(-cfg.max_model_len // BLOCK_SIZE)
    rows = BlockTableRows(width)
    for _, out in points:  # the warm-up, in grid order
        for sr in out.scheduled:
            rows.row_index(sr.request.request_id, sr.block_ids)
    rng = round_order_rng(seed)
    shares: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for i in rng.permutation(len(points)).tolist():
            kind, out = points[i]
            stale = 0
            for sr in out.scheduled:
                stale += not rows.holds(sr.request.request_id, sr.block_ids)
                rows.row_index(sr.request.request_id, sr.block_ids)
            shares.setdefault(kind, []).append(stale / len(out.scheduled))
    return {kind: float(np.mean(v)) for kind, v in sorted(shares.items())}


def row_index_us(rewrite: bool, n: int = 128, blocks: int = 64) -> float:
    """us per step of `row_index` for `n` rows, found in place or rewritten every step."""
    rows = BlockTableRows(512, 2 * n)
    a = [list(range(k * blocks + 1, (k + 1) * blocks + 1)) for k in range(n)]
    b = [[x + 100_000 for x in r] for r in a]
    flip = [False]

    def step() -> None:
        src = b if rewrite and flip[0] else a
        flip[0] = not flip[0]
        for k in range(n):
            rows.row_index(f"r{k}", src[k])

    step()
    return 1e6 * statistics.median(timeit.repeat(step, number=200, repeat=7)) / 200


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shared, own = rewritten_share(False), rewritten_share(True)
    print(f"{MODEL} block {BLOCK_SIZE}: share of a timed call's rows rewritten")
    print(f"{'kind':12s} {'ids shared by all points':>26s} {'ids of its own':>16s}")
    table = []
    for kind in shared:
        print(f"{kind:12s} {shared[kind]:26.2f} {own[kind]:16.2f}")
        table.append(
            {"kind": kind, "shared_ids": round(shared[kind], 3), "own_ids": round(own[kind], 3)}
        )
    in_place, rewritten = row_index_us(False), row_index_us(True)
    print(
        f"row_index, 128 rows of 64 blocks: {in_place:.1f} us found in place, "
        f"{rewritten:.1f} us rewritten"
    )
    table.append(
        {
            "kind": "row_index_us_128x64",
            "shared_ids": round(rewritten, 1),
            "own_ids": round(in_place, 1),
        }
    )
    if args.out:
        write_host_csv(
            args.out, "calibration_rows", table, note="last row: us per step of row_index"
        )


if __name__ == "__main__":
    main()
