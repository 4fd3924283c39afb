"""Host time of a graph step's block-table gather: whole rows against the columns in use (no GPU).

A graph step gathers its sequences' block-table rows into the staged host buffer
(`pagesim.gpu.input_buffers`). Rows are max_model_len / block_size entries wide; at a
1,024-token context a sequence uses 64 of them. On the H200's host, gathering whole rows took
1.24 ms of a 128-sequence qwen2.5-7b step (8,192 entries per row) against 84 us for
llama-3-8b's (512; `results/runner_host/widths.csv`). This times, on this machine, the
whole-row gather (`np.take` of every row, then null padding rows: the runner before
`GatheredTable`) and `GatheredTable.gather`, over the same rows, for each shipped model's
table width at 8, 32 and 128 sequences; the buffer is reused across steps as in the runner.

    python benchmarks/table_gather.py [--out results/table_gather.csv]

Prints the table and writes the CSV (median of 7 repeats of 2,000 gathers each, us).
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import numpy as np
from host_csv import write_host_csv

from pagesim.config import EngineConfig
from pagesim.gpu.input_buffers import BlockTableRows, GatheredTable
from pagesim.kvcache.block_table import NULL_BLOCK_ID

MODELS = ("llama-2-7b", "llama-3-8b", "qwen2.5-7b")
BATCHES = (8, 32, 128)
CONTEXT = 1024
BLOCK_SIZE = 16
PADDED = 128  # captured graph size the batches pad to (the largest batch: no padding)


def width_of(model: str) -> int:
    """The graph path's table width for `model` at its default max_model_len (`StepGraphs`)."""
    from pagesim.gpu.runner import table_width

    cfg = EngineConfig.create(model=model, gpu="h200", block_size=BLOCK_SIZE)
    return table_width(-(-cfg.max_model_len // BLOCK_SIZE))


def time_us(fn, number: int = 2000, repeat: int = 7) -> float:
    return 1e6 * statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows_out = []
    print(
        f"{'model':12s} {'width':>6s} {'seqs':>5s} {'whole rows us':>14s} "
        f"{'columns in use us':>18s}"
    )
    for model in MODELS:
        width = width_of(model)
        rows = BlockTableRows(width, 2 * PADDED)
        blocks = CONTEXT // BLOCK_SIZE
        idx_all = [
            rows.row_index(f"r{i}", list(range(i * blocks + 1, (i + 1) * blocks + 1)))
            for i in range(PADDED)
        ]
        for n in BATCHES:
            idx = idx_all[:n]
            size = max(n, 8)
            whole = np.zeros((PADDED, width), dtype=np.int32)
            gathered = GatheredTable(np.zeros((PADDED, width), dtype=np.int32))

            def whole_rows(rows=rows, idx=idx, whole=whole, n=n, size=size):
                np.take(rows.table, idx, axis=0, out=whole[:n])
                whole[n:size] = NULL_BLOCK_ID

            def in_use(rows=rows, idx=idx, gathered=gathered, size=size):
                gathered.gather(rows, idx, size)

            whole_rows()
            in_use()
            assert (whole[:size] == gathered.out[:size]).all()
            a, b = time_us(whole_rows), time_us(in_use)
            print(f"{model:12s} {width:6d} {n:5d} {a:14.1f} {b:18.1f}")
            rows_out.append(
                {
                    "model": model,
                    "width": width,
                    "seqs": n,
                    "context": CONTEXT,
                    "whole_rows_us": round(a, 2),
                    "columns_in_use_us": round(b, 2),
                }
            )
    if args.out:
        write_host_csv(args.out, "table_gather", rows_out)


if __name__ == "__main__":
    main()
