"""Measure only the tables whose rows carry their own reference on this GPU: shared prefixes
(decode_shared.csv, decode_shared_spread.csv, varlen_shared.csv) and context spread
(decode_spread.csv).

Each such row is timed with its reference (the same step over distinct blocks; every context
at the mean) in the same rounds, and only the ratio of the two is used, so the rows can be
added to a profile measured in another call of the same model and GPU:

    PYTHONPATH=. python3 benchmarks/calibrate_referenced.py --models llama-2-7b,llama-3-8b \\
        --out $OUT [--tables shared,spread]

runs `run_calibration` with the default grid of those tables and a minimal rest (one decode
and one prefill point, which a profile requires), block sizes 16 and 32, and writes the
profiles under `--out`/calibration/. `--dry-run-cpu` runs the tiny model under the Triton
interpreter with small points, to test this script without a GPU.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="out")
    ap.add_argument("--tables", default="shared,spread")
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import CalibrationGrid
    from pagesim.gpu.profiler import run_calibration

    tables = set(args.tables.split(","))
    dry = args.dry_run_cpu
    base = CalibrationGrid()
    grid = CalibrationGrid(
        block_sizes=(16, 32),
        full_block_sizes=(16, 32),
        decode_batches=(16,) if not dry else (4,),
        decode_contexts=(1024,) if not dry else (64,),
        prefill_tokens=(128,) if not dry else (16,),
        prefill_cached=(0,),
        mixed=(),
        multi_prefill=(),
        overhead_max_reqs=16 if not dry else 4,
        decode_shared=(base.decode_shared if not dry else ((4, 64, 32),))
        if "shared" in tables
        else (),
        varlen_shared=(base.varlen_shared if not dry else ((2, 64, 1, 16, 32),))
        if "shared" in tables
        else (),
        decode_shared_spread=(base.decode_shared_spread if not dry else ((4, 32, 32, 16),))
        if "shared" in tables
        else (),
        decode_spread=(base.decode_spread if not dry else ((4, 64, 32),))
        if "spread" in tables
        else (),
        repeats=5 if not dry else 2,
        min_repeats=3 if not dry else 1,
    )
    for name in args.models.split(","):
        t = time.monotonic()
        if dry:
            config = EngineConfig.create(
                model="tiny-llama",
                block_size=16,
                max_num_seqs=8,
                max_num_batched_tokens=256,
                max_model_len=512,
                num_gpu_blocks_override=256,
            )
        else:
            config = EngineConfig.create(model=name, gpu="h200", block_size=16)
        res = run_calibration(
            config,
            grid,
            dtype=torch.float32 if dry else torch.bfloat16,
            calibration_root=Path(args.out) / "calibration",
            device="cpu" if dry else "cuda",
        )
        p = res.profile
        print(
            f"{name}: {len(p.decode_shared)} decode_shared, "
            f"{len(p.decode_shared_spread)} decode_shared_spread, {len(p.varlen_shared)} "
            f"varlen_shared, {len(p.decode_spread)} decode_spread rows in "
            f"{time.monotonic() - t:.0f} s -> {res.directory}",
            flush=True,
        )
        del res
        if not dry:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
