"""All-reduce time vs message size on N local GPUs (the `allreduce.csv` table of a TP profile).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python3 benchmarks/allreduce_tp.py --tp 2 --out $OUT

One spawned process per GPU (multicast off, as `pagesim.gpu.parallel` sets it), bf16 sum
all-reduces from 1 KiB to 256 MiB, `pagesim.gpu.allreduce_bench.bench_allreduce`'s method.
Writes `allreduce_tp<N>.csv` with the GPU, driver, torch and triton versions and the date.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from pagesim.gpu.parallel import MULTICAST_OFF_ENV


def rank_main(rank: int, world_size: int, init_method: str, out: str) -> None:
    import torch
    import triton

    from pagesim.gpu.allreduce_bench import bench_allreduce
    from pagesim.gpu.parallel import init_tensor_parallel

    device = torch.device(f"cuda:{rank}")
    group = init_tensor_parallel(rank, world_size, init_method, device)
    rows = bench_allreduce(group)
    if rank == 0:
        import subprocess

        driver = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
            )
            .stdout.split("\n")[0]
            .strip()
        )
        path = Path(out) / f"allreduce_tp{world_size}.csv"
        with path.open("w") as f:
            f.write(
                f"# {torch.cuda.get_device_name(0)} x{world_size}, driver {driver}, torch "
                f"{torch.__version__}, triton {triton.__version__}, "
                f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n"
            )
            f.write("tp,message_bytes,time_us,time_p10_us,time_p90_us\n")
            for r in rows:
                f.write(
                    f"{r.tp},{r.message_bytes},{r.time_us:.3f},{r.time_p10_us:.3f},"
                    f"{r.time_p90_us:.3f}\n"
                )
        print(path.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    a = ap.parse_args()
    os.environ.update(MULTICAST_OFF_ENV)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    from pagesim.gpu.parallel import launch

    launch(rank_main, a.tp, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
