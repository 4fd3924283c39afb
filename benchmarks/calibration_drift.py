"""How far one block size's calibration rows move within one GPU call (GPU).

The calibration measures block sizes one after another. This measures the decode rows of
block sizes 16 and 32 twice, in the order 16, 32, 16, 32 (passes A and B), with one model in
one process, and compares each block size's two passes point by point (B / A) and the two
block sizes within each pass (32 / 16), for the step time and its non-attention part
(`other_ms`, which cannot depend on the block size). The SM clock is sampled during each
pass.

    PYTHONPATH=. python3 benchmarks/calibration_drift.py --model llama-3-8b --out $OUT

`--dry-run-cpu` runs a tiny model under the Triton interpreter (a check of the script, not
a measurement). Prints a table; writes calibration_drift.csv under --out.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

PASSES = (("A", 16), ("A", 32), ("B", 16), ("B", 32))


def _ratios(num: dict, den: dict, field: str) -> list[float]:
    return [getattr(num[k], field) / getattr(den[k], field) for k in sorted(num.keys() & den)]


def _summary(values: list[float]) -> str:
    if not values:
        return "no common points"
    return (
        f"median {statistics.median(values):.3f}, range {min(values):.3f}-"
        f"{max(values):.3f} over {len(values)} points"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--out", default=os.environ.get("OUT", "results/gpu_variance"))
    ap.add_argument("--dry-run-cpu", action="store_true")
    args = ap.parse_args()
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import calibrate_block_size
    from pagesim.gpu.calibration_grid import CalibrationGrid
    from pagesim.gpu.device import ClockSampler, device_info
    from pagesim.gpu.memory import MemorySnapshot, measure_kv_capacity
    from pagesim.gpu.model import RandomWeightDecoder
    from pagesim.gpu.profiler import override_capacity
    from pagesim.gpu.runner import GPUModelRunner

    if args.dry_run_cpu:
        config = EngineConfig.create(
            model="tiny-llama",
            block_size=16,
            max_num_seqs=4,
            max_num_batched_tokens=64,
            max_model_len=256,
            num_gpu_blocks_override=128,
        )
        grid = CalibrationGrid(
            block_sizes=(16, 32), decode_batches=(1, 2), decode_contexts=(16, 40), repeats=3
        )
        dev, dtype = torch.device("cpu"), torch.float32
    else:
        config = EngineConfig.create(model=args.model, gpu="h200", block_size=16)
        grid = CalibrationGrid(block_sizes=(16, 32))
        dev, dtype = torch.device("cuda"), torch.bfloat16
    info = device_info(dev if dev.type == "cuda" else None)
    print(f"device {info}")
    before = MemorySnapshot.take(dev) if dev.type == "cuda" else None  # before the weights
    model = RandomWeightDecoder(config.model_spec, dtype, dev, 16, 0)
    if before is not None:
        capacity = measure_kv_capacity(config, model, before, (16, 32))
    else:
        capacity = override_capacity(config, (16, 32))
    rows: dict[tuple[str, int], dict] = {}
    clocks: dict[tuple[str, int], dict] = {}
    t0 = time.monotonic()
    for name, bs in PASSES:
        model.set_block_size(bs)
        runner = GPUModelRunner(
            config.replace(block_size=bs),
            capacity.num_gpu_blocks[bs],
            device=dev,
            model=model,
            seed=0,
            cuda_graphs=dev.type == "cuda",
            log=print,
        )
        with ClockSampler() as sampler:
            measured = calibrate_block_size(
                runner,
                bs,
                grid,
                max_model_len=config.max_model_len,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs,
                full=False,
                seed=0,
            )
        rows[(name, bs)] = {(r.batch_size, r.context_len): r for r in measured.decode}
        clocks[(name, bs)] = sampler.summary()
        print(
            f"pass {name} block {bs}: {len(measured.decode)} decode rows, "
            f"{time.monotonic() - t0:.0f} s so far, SM clock {clocks[(name, bs)]}"
        )
        del runner
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "calibration_drift.csv").open("w", newline="") as f:
        f.write(
            f"# pagesim calibration_drift, {info.get('date', '')}, {info.get('gpu_name', 'cpu')}, "
            f"driver {info.get('driver', '')}, torch {info.get('torch', '')}, "
            f"triton {info.get('triton', '')}, model {config.model}\n"
        )
        w = csv.writer(f)
        w.writerow(
            [
                "pass",
                "block_size",
                "batch_size",
                "context_len",
                "step_time_ms",
                "other_ms",
                "pass_mean_sm_mhz",
            ]
        )
        for (name, bs), table in rows.items():
            for (b, c), r in sorted(table.items()):
                w.writerow(
                    [
                        name,
                        bs,
                        b,
                        c,
                        f"{r.step_time_ms:.4f}",
                        f"{r.other_ms:.4f}",
                        f"{clocks[(name, bs)].get('mean_mhz', 0):.0f}",
                    ]
                )
    for field in ("step_time_ms", "other_ms"):
        for bs in (16, 32):
            print(
                f"{field} block {bs}, pass B / A: "
                f"{_summary(_ratios(rows[('B', bs)], rows[('A', bs)], field))}"
            )
        for name in ("A", "B"):
            print(
                f"{field} pass {name}, block 32 / 16: "
                f"{_summary(_ratios(rows[(name, 32)], rows[(name, 16)], field))}"
            )
    print(f"wrote {out / 'calibration_drift.csv'}")


if __name__ == "__main__":
    main()
