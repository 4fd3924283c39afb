"""Tensor parallelism for the GPU runner: process groups, sharding, parallel linear layers.

The Megatron-LM layout (Shoeybi et al. 2019) as vLLM uses it (`vllm/model_executor/layers/
linear.py`, `vocab_parallel_embedding.py`), with weights stored `[out, in]` as `F.linear` takes
them and `tp` ranks:

    column-parallel  W split by rows (outputs): rank r holds rows [r * out / tp, (r+1) * out / tp)
                     y_r = x @ W_r^T is rank r's slice of y; no communication
    row-parallel     W split by columns (inputs): rank r holds columns [r * in / tp, ...)
                     y = sum_r x_r @ W_r^T: one all-reduce of [T, out], bias added after it
    vocab-parallel   embedding and LM head split by vocabulary rows (padded to tp equal parts):
                     the embedding masks foreign ids and all-reduces; the LM head all-gathers

A Llama layer is then column(qkv) -> attention over the rank's heads -> row(o), all-reduce,
column(gate_up) -> SwiGLU -> row(down), all-reduce: two all-reduces per layer over the step's
hidden states `[T, hidden]`. Fused projections are sharded part by part (q, k and v heads;
gate and up rows), as vLLM's `QKVParallelLinear` and `MergedColumnParallelLinear` do. KV heads
are split when there are at least `tp` of them and replicated otherwise (rank r then holds
head `r * num_kv_heads // tp`), so every rank's query heads keep their own KV head.

Processes: one per rank, each calling `init_tensor_parallel`. Two groups, as vLLM has: the
device group (NCCL on GPUs, gloo on CPUs) for activations, and a gloo CPU group for Python
objects (the scheduler output that rank 0 broadcasts). NVLink multicast (NVLS, symmetric
memory multicast, NVSHMEM NVLS) stays off in every process: `init_tensor_parallel` sets
`MULTICAST_OFF_ENV` before NCCL starts, and `multicast_off_env` gives the environment for any
process started with its own environment.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from pagesim.errors import ConfigError

#: NVLink multicast off: NCCL's NVLS algorithms, torch symmetric-memory multicast, NVSHMEM NVLS.
MULTICAST_OFF_ENV: Mapping[str, str] = MappingProxyType(
    {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
)


def multicast_off_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with `MULTICAST_OFF_ENV` set, for a child
    process started with an explicit environment (`subprocess.run(..., env=...)`)."""
    env = dict(os.environ if base is None else base)
    env.update(MULTICAST_OFF_ENV)
    return env


def disable_multicast() -> None:
    """Set `MULTICAST_OFF_ENV` in this process; call before the first NCCL communicator."""
    os.environ.update(MULTICAST_OFF_ENV)


# ---- process groups ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel group and the collectives it uses.

    `device_group` None is a *solo* group: one process holding rank `rank`'s shard of a
    `world_size`-way split, with every collective skipped (all-reduce is the identity, the
    logits all-gather repeats the local shard). It times one rank's compute on one GPU.
    """

    rank: int
    world_size: int  # tensor_parallel_size
    device_group: Any | None  # ProcessGroup for activations (NCCL on GPUs, gloo on CPUs)
    cpu_group: Any | None  # gloo ProcessGroup for Python objects

    @classmethod
    def solo(cls, tensor_parallel_size: int, rank: int = 0) -> TPGroup:
        """Rank `rank`'s shard of a `tensor_parallel_size`-way model, without communication."""
        _check_rank(rank, tensor_parallel_size)
        return cls(rank, tensor_parallel_size, None, None)

    @property
    def is_solo(self) -> bool:
        return self.device_group is None

    @property
    def is_driver(self) -> bool:
        """Rank 0 runs the scheduler and broadcasts its output (vLLM's driver worker)."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of `x` over the ranks, in place; returns `x`."""
        if self.device_group is not None and self.world_size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """`[..., n]` shards -> `[..., world_size * n]`, rank-major along the last dim."""
        if self.world_size == 1:
            return x
        if self.device_group is None:
            return torch.cat([x] * self.world_size, dim=-1)
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank (pickled over the gloo CPU group)."""
        if self.cpu_group is None or self.world_size == 1:
            return obj
        box = [obj if self.rank == src else None]
        dist.broadcast_object_list(box, src=src, group=self.cpu_group)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank (tests and reports)."""
        if self.cpu_group is None or self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out


def init_tensor_parallel(
    rank: int,
    world_size: int,
    init_method: str,
    device: torch.device | str = "cpu",
    timeout_s: float = 300.0,
) -> TPGroup:
    """Join the group of `world_size` processes at `init_method` (file:// or tcp://).

    NCCL for CUDA devices (the process's current device is set to `device` first), gloo for
    CPUs; a second gloo group carries Python objects. Multicast is turned off before NCCL
    starts.
    """
    _check_rank(rank, world_size)
    disable_multicast()
    device = torch.device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    kwargs: dict[str, Any] = {}
    if device.type == "cuda":
        torch.cuda.set_device(device)
        kwargs["device_id"] = device  # binds the NCCL communicator to this device eagerly
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        **kwargs,
    )
    world = dist.group.WORLD
    cpu_group = world if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    return TPGroup(rank, world_size, world, cpu_group)


def destroy_tensor_parallel() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def file_init_method(directory: str | Path | None = None) -> str:
    """A fresh `file://` rendezvous (the file must not exist yet; torch creates it)."""
    d = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="pagesim-tp-"))
    return f"file://{d / 'rendezvous'}"


def launch(
    fn: Callable[..., None], world_size: int, *args: Any, init_method: str | None = None
) -> None:
    """Run `fn(rank, world_size, init_method, *args)` in `world_size` spawned processes (no
    torchrun); raises if any rank raised. `fn` must be importable (a module-level function).
    Children start from this process's environment; each sets `MULTICAST_OFF_ENV` itself in
    `init_tensor_parallel`."""
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ConfigError(f"tensor_parallel_size={world_size!r}: must be >= 1")
    if init_method is not None:
        mp.spawn(_entry, args=(fn, world_size, init_method, args), nprocs=world_size, join=True)
        return
    with tempfile.TemporaryDirectory(prefix="pagesim-tp-") as rendezvous:
        launch(fn, world_size, *args, init_method=file_init_method(rendezvous))


def _entry(
    rank: int, fn: Callable[..., None], world_size: int, init_method: str, args: tuple
) -> None:
    disable_multicast()
    fn(rank, world_size, init_method, *args)


# ---- sharding ----------------------------------------------------------------------------------
def _check_rank(rank: int, tp: int) -> None:
    if not isinstance(tp, int) or tp < 1:
        raise ConfigError(f"tensor_parallel_size={tp!r}: must be an integer >= 1")
    if not isinstance(rank, int) or not 0 <= rank < tp:
        raise ConfigError(f"rank={rank!r}: must be in [0, {tp})")


def split_range(n: int, rank: int, tp: int, what: str = "size") -> tuple[int, int]:
    """Rank `rank`'s `[start, stop)` of `n` items split evenly over `tp` ranks."""
    _check_rank(rank, tp)
    if n % tp:
        raise ConfigError(f"tensor_parallel_size={tp}: must divide {what}={n}")
    per = n // tp
    return rank * per, (rank + 1) * per


def kv_head_range(num_kv_heads: int, rank: int, tp: int) -> tuple[int, int]:
    """KV heads of rank `rank`: split when num_kv_heads >= tp, else one replicated head."""
    if num_kv_heads >= tp:
        return split_range(num_kv_heads, rank, tp, "num_kv_heads")
    _check_rank(rank, tp)
    if tp % num_kv_heads:
        raise ConfigError(
            f"tensor_parallel_size={tp}: must be a multiple of "
            f"num_kv_heads={num_kv_heads} when larger"
        )
    head = rank * num_kv_heads // tp
    return head, head + 1


def vocab_range(vocab_size: int, rank: int, tp: int) -> tuple[int, int, int]:
    """(start, stop, rows per rank) of a vocab-parallel table: ceil(vocab / tp) rows per rank,
    the last rank's tail padded with zero rows (vLLM pads to a multiple too)."""
    _check_rank(rank, tp)
    per = -(-vocab_size // tp)
    start = min(rank * per, vocab_size)
    return start, min(start + per, vocab_size), per


def shard_rows(
    w: torch.Tensor, rank: int, tp: int, parts: tuple[int, ...] | None = None, what: str = "rows"
) -> torch.Tensor:
    """Column-parallel shard of `[out, ...]` (a weight or a bias): each of `parts` (row counts
    of fused sub-matrices, default the whole) split evenly; a new contiguous tensor."""
    parts = parts or (w.shape[0],)
    if sum(parts) != w.shape[0]:
        raise ConfigError(f"{what}: parts {parts} do not add up to {w.shape[0]} rows")
    pieces, at = [], 0
    for n in parts:
        lo, hi = split_range(n, rank, tp, what)
        pieces.append(w[at + lo : at + hi])
        at += n
    return torch.cat(pieces).contiguous()


def shard_cols(w: torch.Tensor, rank: int, tp: int, what: str = "columns") -> torch.Tensor:
    """Row-parallel shard of `[out, in]`: rank `rank`'s columns, a new contiguous tensor."""
    lo, hi = split_range(w.shape[1], rank, tp, what)
    return w[:, lo:hi].contiguous()


def shard_qkv(
    w: torch.Tensor, num_heads: int, num_kv_heads: int, head_size: int, rank: int, tp: int
) -> torch.Tensor:
    """Fused `[q + 2 kv, ...]` rows -> rank `rank`'s q heads, then its k heads, then its v
    heads (vLLM's QKVParallelLinear)."""
    q = num_heads * head_size
    kv = num_kv_heads * head_size
    if w.shape[0] != q + 2 * kv:
        raise ConfigError(f"qkv rows={w.shape[0]}: expected {q + 2 * kv}")
    h0, h1 = split_range(num_heads, rank, tp, "num_attention_heads")
    k0, k1 = kv_head_range(num_kv_heads, rank, tp)
    d = head_size
    return torch.cat(
        [w[h0 * d : h1 * d], w[q + k0 * d : q + k1 * d], w[q + kv + k0 * d : q + kv + k1 * d]]
    ).contiguous()


def shard_vocab(w: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Vocab-parallel shard of `[vocab, hidden]`, zero-padded to `vocab_range`'s rows."""
    start, stop, per = vocab_range(w.shape[0], rank, tp)
    out = w.new_zeros((per, *w.shape[1:]))
    out[: stop - start] = w[start:stop]
    return out


# ---- parallel layers (functional: the model keeps plain tensors) ----------------------------
def row_parallel_linear(
    x: torch.Tensor, weight: torch.Tensor, group: TPGroup, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """`[T, in / tp]` sharded input -> `[T, out]` summed over ranks (one all-reduce); the bias
    is added once, after the reduction."""
    y = group.all_reduce(F.linear(x, weight))
    return y if bias is None else y + bias


def vocab_parallel_embedding(
    input_ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, group: TPGroup
) -> torch.Tensor:
    """`[T]` ids -> `[T, hidden]`: rows this rank holds, zeros elsewhere, all-reduced."""
    if group.world_size == 1:
        return F.embedding(input_ids, weight)
    local = input_ids - vocab_start
    mine = (local >= 0) & (local < weight.shape[0])
    out = F.embedding(local.clamp(0, weight.shape[0] - 1), weight)
    out = out * mine.unsqueeze(-1).to(out.dtype)
    return group.all_reduce(out)
