"""All-reduce time across message sizes on a tensor-parallel group (the `allreduce.csv` table).

A TP step all-reduces the hidden states of its tokens twice per layer: `T * hidden * 2` bytes
in bf16, from 16 KiB (one decode token of a 70B model) to over 100 MiB (an 8k-token prefill).
`bench_allreduce` measures the sum all-reduce of a message of each size, as nccl-tests does:

    per size: `warmup` untimed calls, then `repeats` samples; a sample is `inner` back-to-back
    all-reduces between two device syncs, divided by `inner` (amortizes launch and skew between
    ranks, as the step's all-reduces sit back to back with its GEMMs in stream order)
    every sample is the slowest rank's (an all-reduce of the per-rank times with MAX), so all
    ranks return the same rows; kept: median, 10th and 90th percentile, in microseconds

Every rank of the group must call it with the same arguments (it is a collective), so it
takes no device: each rank times on its own (`group_device`), and rank 0's arguments can be
broadcast to the others as they are (`tp_runner.run_collective`). On gloo (CPU) it runs too,
which is what the CPU tests do; those times describe the CPU, not a GPU.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.distributed as dist

from pagesim.cost.profile import AllReduceRow
from pagesim.errors import ConfigError
from pagesim.gpu.calibration_grid import median_p10_p90
from pagesim.gpu.parallel import TPGroup

#: 1 KiB .. 256 MiB in powers of two: a decode token of a 7B model up to a 16k-token prefill
#: of a 70B model.
DEFAULT_MESSAGE_BYTES: tuple[int, ...] = tuple(1 << k for k in range(10, 29))

METHOD = (
    "allreduce.csv: torch.distributed.all_reduce (sum) of {dtype} messages on the "
    "{backend} device group, multicast off (NCCL_NVLS_ENABLE=0, "
    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1); per size {warmup} "
    "warm-up calls, then {repeats} samples of `inner` back-to-back calls between device "
    "syncs divided by `inner` (20 below 1 MiB, 5 below 64 MiB, else 2), each the slowest "
    "rank's; median, p10, p90."
)


def default_inner(message_bytes: int) -> int:
    """Back-to-back calls per sample: more for small messages, whose time is mostly latency."""
    if message_bytes < (1 << 20):
        return 20
    return 5 if message_bytes < (64 << 20) else 2


def group_device(group: TPGroup) -> torch.device:
    """This rank's device for the group's collectives: its current CUDA device on NCCL (set
    by `init_tensor_parallel`), else the CPU."""
    if dist.get_backend(group.device_group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def bench_allreduce(
    group: TPGroup,
    message_bytes: tuple[int, ...] = DEFAULT_MESSAGE_BYTES,
    *,
    dtype: torch.dtype = torch.bfloat16,
    warmup: int = 5,
    repeats: int = 20,
    inner: int | None = None,
) -> list[AllReduceRow]:
    """One `AllReduceRow` per message size (bytes, rounded down to whole elements)."""
    if group.is_solo or group.world_size < 2:
        raise ConfigError(
            f"tensor_parallel_size={group.world_size}: the all-reduce benchmark "
            "needs a group of at least 2 processes"
        )
    if repeats < 1 or warmup < 0:
        raise ConfigError(f"repeats={repeats}, warmup={warmup}: need repeats >= 1, warmup >= 0")
    device = group_device(group)
    itemsize = torch.empty((), dtype=dtype).element_size()
    rows: list[AllReduceRow] = []
    for nbytes in message_bytes:
        n = nbytes // itemsize
        if n < 1:
            raise ConfigError(f"message_bytes={nbytes}: smaller than one {dtype} element")
        x = torch.zeros(n, dtype=dtype, device=device)  # sums stay finite call after call
        k = inner or default_inner(nbytes)
        for _ in range(warmup):
            dist.all_reduce(x, group=group.device_group)
        samples = [_sample(x, k, group, device) for _ in range(repeats)]
        us = median_p10_p90(np.asarray(samples) * 1e6)
        rows.append(AllReduceRow(group.world_size, n * itemsize, *us))
        del x
    return rows


def _sample(x: torch.Tensor, inner: int, group: TPGroup, device: torch.device) -> float:
    """Seconds per all-reduce over `inner` back-to-back calls, the slowest rank's."""
    _sync(device)
    t = time.perf_counter()
    for _ in range(inner):
        dist.all_reduce(x, group=group.device_group)
    _sync(device)
    dt = torch.tensor([(time.perf_counter() - t) / inner], dtype=torch.float64)
    if device.type == "cuda":
        dt = dt.to(device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group.device_group)
    return float(dt.item())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
