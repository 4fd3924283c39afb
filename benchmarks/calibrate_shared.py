"""Measure only the shared-prefix tables (decode_shared.csv, varlen_shared.csv) on this GPU.

Their rows carry their own unshared references, timed in the same rounds, so they can be
added to a profile measured in another call of the same model and GPU:

    PYTHONPATH=. python3 benchmarks/calibrate_shared.py --models llama-2-7b,llama-3-8b --out $OUT

runs `run_calibration` with the default shared-prefix grid and a minimal rest (one decode
and one prefill point, which a profile requires), block sizes 16 and 32, and writes the
profiles under `--out`/calibration/.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="out")
    args = ap.parse_args()
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import CalibrationGrid
    from pagesim.gpu.profiler import run_calibration

    grid = CalibrationGrid(block_sizes=(16, 32), full_block_sizes=(16, 32), decode_batches=(16,),
                           decode_contexts=(1024,), prefill_tokens=(128,), prefill_cached=(0,),
                           mixed=(), multi_prefill=(), overhead_max_reqs=16)
    for name in args.models.split(","):
        t = time.monotonic()
        config = EngineConfig.create(model=name, gpu="h200", block_size=16)
        res = run_calibration(config, grid, dtype=torch.bfloat16,
                              calibration_root=Path(args.out) / "calibration")
        print(f"{name}: {len(res.profile.decode_shared)} decode_shared, "
              f"{len(res.profile.varlen_shared)} varlen_shared rows in "
              f"{time.monotonic() - t:.0f} s -> {res.directory}", flush=True)
        del res
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
