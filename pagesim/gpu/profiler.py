"""The whole calibration of one model on the local GPU: memory, grid, host overhead, profile.

    weights (random, from the seed) -> measured KV capacity (vLLM's profile run)
    for each block size: a KV cache of the measured size -> grid rows (calibrate.py)
    a real replay of a decode ramp, requests joining it -> host overhead per step by batch
                                    size, and the extra of a step that admits prompts
    pinned-memory copies -> host link rate (prices swap preemption)
    -> Profile (pagesim.cost.profile), saved under calibration/<gpu>/<model>/

`calibrate` is that flow from the loaded model on, for one GPU (`run_calibration`: a world
of size 1) and for tensor parallelism alike (`pagesim.gpu.tp_profiler`: an N-way `World`,
the group's driver runner, the all-reduce table). The fully measured block sizes run first,
so that a time budget that runs out leaves the most useful rows measured.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from pagesim.config import EngineConfig
from pagesim.cost.profile import AllReduceRow, Profile, ProfileMetadata, profile_dir
from pagesim.errors import ConfigError
from pagesim.gpu.calibrate import CalibrationGrid, CalibrationRows, Progress, calibrate_block_size
from pagesim.gpu.cuda_graphs import capture_sizes
from pagesim.gpu.device import device_info, require_cuda
from pagesim.gpu.kernels.arch import device_arch
from pagesim.gpu.kernels.configs import decode_config, prefill_config
from pagesim.gpu.memory import (
    MeasuredKVCapacity,
    MemorySnapshot,
    measure_kv_capacity,
    page_sizes,
    release_cached,
)
from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
from pagesim.gpu.modes import backend_description
from pagesim.gpu.overhead import (
    NUM_JOINING,
    admission_overhead,
    overhead_requests,
    overhead_rows,
    ramp_prompt_len,
)
from pagesim.gpu.parallel import TPGroup
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
from pagesim.gpu.serve import make_engine, replay
from pagesim.gpu.tp_model import TensorParallelDecoder

MakeRunner = Callable[[EngineConfig, int], Any]  # (config, num_gpu_blocks) -> ModelRunner

METHOD = (
    "step_time_ms: host wall time of GPUModelRunner.execute_model (input preparation, "
    "forward, LM head, random sampling, device sync) on a synthetic SchedulerOutput; "
    "2 warm-up calls per point, then 3-5 interleaved rounds (every point timed once per "
    "round, in a seeded random order); median and p10/p90 over the rounds. other_ms: "
    "the same with attention replaced by the identity, timed once per (block size, "
    "batch) for decode rows, per (block size, new tokens) for prefill rows and per "
    "(new tokens, decodes) of the mixed points; attention_ms = "
    "step - other. overhead_ms: host time per decode-only engine step outside "
    "execute_model (schedule + update_from_output + metrics), from a real replay of a "
    "decode ramp (prompts as long as the cache allows) at block size {bs}, median by "
    "batch size; overhead_prefill_step_ms, overhead_per_prefill_ms: the extra host "
    "time of the replay's steps with prefill entries (requests joining the ramp one at "
    "a time), least squares."
)


@dataclass(frozen=True)
class CalibrationResult:
    profile: Profile
    capacity: MeasuredKVCapacity  # tensor parallel: rank 0's, with the group's block counts
    directory: Path | None
    elapsed_s: float
    model: RandomWeightDecoder  # the weights, kept for real runs in the same process


@dataclass(frozen=True)
class World:
    """What a profile's step times ran on: one GPU (the default), an N-way tensor-parallel
    group whose step times include its all-reduces, or one rank's shard alone (`shard`: no
    all-reduce in the times; saved under `<model>-tp<N>-shard/`)."""

    tensor_parallel_size: int = 1
    allreduce_in_step_times: bool = True
    method: str = ""  # what the profile's method says beyond the single-GPU method
    notes: str = ""  # what the profile's notes say after the seed
    capacity_notes: bool = True  # the notes give the measured KV capacity vs the estimate
    shard: bool = False


def gpu_key(device_name: str) -> str:
    """pagesim's GPU name (`specs.GPUS` key) for a CUDA device name."""
    n = device_name.lower()
    if "h200" in n:
        return "h200"
    if "h100" in n:
        return "h100-pcie" if "pcie" in n else "h100-sxm"
    if "a100" in n:
        return "a100-40gb" if "40gb" in n else "a100-80gb"
    for key in ("l40s", "a10g"):
        if key in n:
            return key
    return re.sub(r"[^a-z0-9]+", "-", n).strip("-") or "gpu"


def measure_host_link(device: torch.device, nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Bytes/s of pinned host <-> device copies (mean of both directions, median of repeats)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        t = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        t_in = time.perf_counter() - t
        t = time.perf_counter()
        host.copy_(dev, non_blocking=True)
        torch.cuda.synchronize(device)
        t_out = time.perf_counter() - t
        rates.append(2 * nbytes / (t_in + t_out))
    del host, dev
    return sorted(rates[1:])[len(rates[1:]) // 2]


@dataclass(frozen=True)
class CalibrationOptions:
    """How a calibration runs, whatever its world."""

    seed: int = 0
    calibration_root: str | Path | None = None  # None: the profile is not saved
    progress: Progress | None = None
    time_budget_s: float | None = None
    log: Callable[[str], None] = print
    cuda_graphs: bool = True


def run_calibration(
    config: EngineConfig,
    grid: CalibrationGrid,
    *,
    dtype: torch.dtype,
    seed: int = 0,
    calibration_root: str | Path | None = "calibration",
    progress: Progress | None = None,
    time_budget_s: float | None = None,
    log: Callable[[str], None] = print,
    device: str = "cuda",
    cuda_graphs: bool = True,
    rank: int = 0,
) -> CalibrationResult:
    """Calibrate `config.model` on this GPU; save the profile if `calibration_root` is set.

    With `config.tensor_parallel_size` N > 1: rank `rank`'s shard of the N-way model alone
    (no communication), saved under `<gpu>/<model>-tp<N>-shard/`; the cost model adds the
    all-reduces. `cuda_graphs` is the runner's flag (decode steps replay graphs, captured
    lazily: each point's warm-up calls capture its graph). `device="cpu"` is a dry run for
    tests (Triton interpreter; no graphs): the KV cache then has
    `config.num_gpu_blocks_override` blocks for every block size and no memory or host-link
    measurement is made.
    """
    if device != "cpu":
        require_cuda()
    t_start = time.monotonic()
    dev = torch.device(device)
    order = tuple(block_order(config, grid))
    model, capacity = load_model(config, order, dtype=dtype, seed=seed, device=dev, rank=rank)
    log(capacity.report())
    n = config.tensor_parallel_size
    world = World()
    if n > 1:
        world = World(
            n,
            allreduce_in_step_times=False,
            method=f" Rank {rank}'s shard of a {n}-way split alone on one GPU: no all-reduce, "
            "no logits all-gather in the times.",
            notes=f", tensor_parallel_size {n}: one rank's shard alone, no communicator",
            capacity_notes=False,
            shard=True,
        )
    runner_options = RunnerConfig(device=dev, seed=seed, cuda_graphs=cuda_graphs)
    options = CalibrationOptions(seed, calibration_root, progress, time_budget_s, log, cuda_graphs)
    return calibrate(
        lambda cfg, blocks: GPUModelRunner(cfg, blocks, runner_options, model=model, log=log),
        model,
        capacity,
        config,
        grid,
        t_start,
        options,
        world,
    )


def calibrate(
    make_runner: MakeRunner,
    model: RandomWeightDecoder,
    capacity: MeasuredKVCapacity,
    config: EngineConfig,
    grid: CalibrationGrid,
    t_start: float,
    options: CalibrationOptions,
    world: World,
    allreduce: tuple[AllReduceRow, ...] = (),
) -> CalibrationResult:
    """The calibration after the model is loaded and its KV capacity known, for any `world`:
    the grid over the block sizes on the runners `make_runner(config, num_gpu_blocks)`
    builds (one GPU's, or a TP group's driver), the host-overhead replay, the host link,
    then the profile (with the group's `allreduce` table), saved if
    `options.calibration_root` is set. The time budget counts from `t_start`."""
    o = options
    deadline = None if o.time_budget_s is None else t_start + o.time_budget_s
    measured, graphs = grid_rows(
        make_runner, config, grid, capacity.num_gpu_blocks, t_start, deadline, options
    )
    overhead, admission = measure_overhead(make_runner, config, capacity.num_gpu_blocks, grid)
    release_cached(model.device)
    o.log(
        f"host overhead rows: {len(overhead)}; a step admitting prompts: "
        + (
            "not measured"
            if admission is None
            else f"+{admission[0]:.3f} ms + {admission[1]:.3f} ms per prefill entry"
        )
    )
    host_link = measure_host_link(model.device) if model.device.type == "cuda" else None
    meta = profile_metadata(config, grid, model, capacity, world, o, admission, host_link, graphs)
    profile = Profile(meta, overhead=tuple(overhead), allreduce=allreduce, **measured.tables())
    directory = None
    if o.calibration_root is not None:
        base = profile_dir(o.calibration_root, meta.gpu, config.model, world.tensor_parallel_size)
        directory = profile.save(base.with_name(base.name + "-shard") if world.shard else base)
    return CalibrationResult(profile, capacity, directory, time.monotonic() - t_start, model)


def block_order(config: EngineConfig, grid: CalibrationGrid) -> list[int]:
    """Fully measured block sizes first (a spent time budget leaves the useful rows)."""
    return sorted(
        set(grid.block_sizes) | {config.block_size},
        key=lambda b: (b not in grid.full_block_sizes, b),
    )


def grid_rows(
    make_runner: MakeRunner,
    config: EngineConfig,
    grid: CalibrationGrid,
    num_gpu_blocks: dict[int, int],
    t_start: float,
    deadline: float | None,
    options: CalibrationOptions,
) -> tuple[CalibrationRows, bool]:
    """The grid's rows over its block sizes, one runner per size, and whether every runner
    replayed CUDA graphs (a runner whose graphs failed to capture runs eagerly, and the
    profile must name the runner it timed)."""
    log = options.log
    measured = CalibrationRows.empty()
    all_graphs = True
    for bs in block_order(config, grid):
        if bs not in grid.block_sizes:
            continue
        if deadline is not None and time.monotonic() > deadline:
            log(f"time budget spent: block size {bs} not measured")
            continue
        runner = make_runner(config.replace(block_size=bs), num_gpu_blocks[bs])
        rows = calibrate_block_size(
            runner,
            grid,
            progress=options.progress,
            seed=options.seed,
            deadline=deadline,
        )
        measured.extend(rows)
        graphs = runner.graphs
        all_graphs = all_graphs and graphs is not None
        log(
            f"block size {bs}: {rows.summary()}, {time.monotonic() - t_start:.0f} s so far"
            + (
                ""
                if graphs is None
                else f"; {len(graphs.graphs)} CUDA graphs captured in "
                f"{graphs.capture_s_total:.1f} s"
                + (f" (FAILED: {graphs.failed})" if graphs.failed else "")
            )
        )
        del graphs
        del runner
        release_cached()
    return measured, all_graphs


def profile_metadata(
    config: EngineConfig,
    grid: CalibrationGrid,
    model: RandomWeightDecoder,
    capacity: MeasuredKVCapacity,
    world: World,
    options: CalibrationOptions,
    admission: tuple[float, float] | None,
    host_link: float | None,
    graphs: bool,
) -> ProfileMetadata:
    """The profile's metadata: where and how its rows were measured (`graphs`: whether the
    timed runners replayed CUDA graphs; on the CPU only their static buffers exist)."""
    dev = model.device
    info = device_info(dev if dev.type == "cuda" else None)
    graphs = graphs and dev.type == "cuda"
    notes = (
        f"random-weight {config.model} (seed {options.seed}){world.notes}; max_num_seqs "
        f"{config.max_num_seqs}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens}, max_model_len {config.max_model_len}"
    )
    if world.capacity_notes:
        notes += "; measured KV capacity vs sizing's estimate (blocks, %): " + ", ".join(
            f"bs{b}: {capacity.error_pct(b):+.2f}" for b in sorted(capacity.num_gpu_blocks)
        )
    return ProfileMetadata(
        gpu=gpu_key(info["gpu_name"]),
        model=config.model,
        gpu_name=info["gpu_name"],
        driver=info.get("driver", ""),
        cuda=info["cuda"],
        torch=info["torch"],
        triton=info["triton"],
        dtype=str(model.dtype).removeprefix("torch."),
        date=info["date"],
        kv_cache_dtype=config.kv_cache_dtype,
        tensor_parallel_size=world.tensor_parallel_size,
        allreduce_in_step_times=world.allreduce_in_step_times,
        attention_backend=backend_description(graphs),
        grid=grid.to_json(),
        num_gpu_blocks=dict(capacity.num_gpu_blocks),
        cuda_graph_sizes=list(capture_sizes(config.max_num_seqs)) if graphs else [],
        cuda_graph_token_sizes=list(capture_sizes(config.max_num_batched_tokens)) if graphs else [],
        **varlen_tiles(model, model.dtype, dev),
        overhead_prefill_step_ms=admission[0] if admission else None,
        overhead_per_prefill_ms=admission[1] if admission else None,
        gpu_memory_utilization=config.gpu_memory_utilization,
        host_link_bytes_per_s=host_link,
        device={
            k: v
            for k, v in info.items()
            if k in ("num_sms", "memory_total_bytes", "compute_capability", "l2_cache_bytes")
        },
        method=METHOD.format(bs=config.block_size) + world.method,
        synthetic=dev.type != "cuda",
        notes=notes,
    )


class LoadedModel(NamedTuple):
    """Random weights on the device and the KV cache they leave, per block size."""

    model: RandomWeightDecoder
    capacity: MeasuredKVCapacity


def load_model(
    config: EngineConfig,
    block_sizes: tuple[int, ...],
    *,
    dtype: torch.dtype,
    seed: int = 0,
    device: str | torch.device = "cuda",
    rank: int = 0,
) -> LoadedModel:
    """The model's random weights (laid out for the first block size; with
    `config.tensor_parallel_size` N > 1, rank `rank`'s shard of them) and the KV blocks each
    block size gets, measured as vLLM measures them (weights loaded, one profiling step, free
    memory); on the CPU (a dry run) `config.num_gpu_blocks_override` blocks for each. What a
    calibration starts with, and all a call that only serves needs."""
    dev = torch.device(device)
    if dev.type != "cuda" and config.num_gpu_blocks_override is None:
        raise ConfigError("device='cpu': a dry run needs num_gpu_blocks_override")
    before = MemorySnapshot.take(dev) if dev.type == "cuda" else None
    n = config.tensor_parallel_size
    weights = DecoderConfig(config.model_spec, dtype, dev, block_sizes[0], seed)
    model = (
        RandomWeightDecoder(weights)
        if n == 1
        else TensorParallelDecoder(weights, TPGroup.solo(n, rank))
    )
    if before is None:
        return LoadedModel(model, override_capacity(config, block_sizes))
    return LoadedModel(model, measure_kv_capacity(config, model, before, block_sizes))


def varlen_tiles(
    model: RandomWeightDecoder, dtype: torch.dtype, device: torch.device
) -> dict[str, int]:
    """The attention kernels' launch parameters, as the runner launches them, for the
    profile's metadata: the variable-length kernel's query tokens per program and keys per
    tile (`prefill_config`), the decode kernel's keys per tile and programs per SM
    (`decode_config`)."""
    group = model.num_heads // model.num_kv_heads
    on_gpu = device.type == "cuda"
    arch = device_arch(device)
    cfg = prefill_config(model.head_size, group, on_gpu, dtype == torch.float32, arch)
    dec = decode_config(model.head_size, group, on_gpu, arch)
    return {
        "varlen_block_q": cfg.block_m // group,
        "varlen_tile_n": cfg.tile_n,
        "decode_tile_n": dec.tile_n,
        "decode_programs_per_sm": dec.programs_per_sm,
    }


def override_capacity(config: EngineConfig, block_sizes: tuple[int, ...]) -> MeasuredKVCapacity:
    """A 'measurement' that is the override itself (CPU dry runs; nothing is measured)."""
    n = config.num_gpu_blocks_override
    pages = page_sizes(config, block_sizes)
    return MeasuredKVCapacity(
        total_memory_bytes=0,
        gpu_memory_utilization=config.gpu_memory_utilization,
        weights_bytes=0,
        activation_peak_bytes=0,
        non_torch_bytes=0,
        available_kv_bytes=n * pages[block_sizes[0]],
        page_size_bytes=pages,
        num_gpu_blocks={bs: n for bs in block_sizes},
        predicted_num_gpu_blocks={bs: n for bs in block_sizes},
        predicted_available_kv_bytes=n * pages[block_sizes[0]],
        profile_tokens=0,
        profile_reqs=0,
    )


def measure_overhead(
    make_runner: MakeRunner,
    config: EngineConfig,
    num_gpu_blocks: dict[int, int],
    grid: CalibrationGrid,
):
    """Replay a decode ramp (all requests at t=0, staggered lengths, prompts as long as the
    cache allows) with requests joining it one at a time (`pagesim.gpu.overhead`) on the
    runner `make_runner(config, blocks)` builds (one GPU, or a TP group's driver); returns
    (decode-only host time by batch size, (ms per admitting step, ms per prefill entry) or
    None)."""
    bs = config.block_size
    blocks = num_gpu_blocks[bs]
    runner = make_runner(config, blocks)
    n = min(grid.overhead_max_reqs, config.max_num_seqs)
    prompt = min(ramp_prompt_len(n, (blocks - 1) * bs), config.max_model_len - 2 * n - 16)
    requests = overhead_requests(
        n,
        prompt_len=max(prompt, 1),
        vocab=config.model_spec.vocab_size,
        num_joining=min(NUM_JOINING, n),
    )
    run = replay(requests, make_engine(config, blocks), runner)
    del runner
    rows = overhead_rows(run.steps[1:], max_reqs=n)
    return rows, admission_overhead(run.steps[1:], rows)
