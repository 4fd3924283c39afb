"""Calibration and real runs of a tensor-parallel engine: N GPUs, or one rank's shard on one.

Two ways to calibrate `config.model` at `config.tensor_parallel_size` N:

    calibrate_tensor_parallel   N processes, one per GPU (`launch(calibration_main, N, ...)`):
                                the step grid through rank 0's scheduler-output broadcast, so
                                every step time includes its all-reduces; then the all-reduce
                                benchmark on the same group -> profile `<gpu>/<model>-tp<N>/`
                                with `allreduce_in_step_times=true` and `allreduce.csv`
    gpu.profiler.run_calibration one process, one GPU: rank 0's shard alone (a solo group,
                                no communication) -> profile `<gpu>/<model>-tp<N>-shard/` with
                                `allreduce_in_step_times=false`; the cost model adds the
                                all-reduces (a measured table, or the analytical term)

Both are the one calibration driver (`gpu.profiler.calibrate`, where one GPU is a world of
size 1) with an N-way `World`; this module adds only what N ranks need: spawning them, the
group's KV capacity, the broadcast runner and the all-reduce table.
KV capacity is measured per rank as vLLM's workers do (`gpu.memory`), and the group keeps the
smallest block count (vLLM takes the minimum over workers). The communicators start before
the memory snapshot, as in vLLM 0.33's worker, so NCCL's buffers are not charged to the KV
budget and a shard measured alone gets the group's block counts.

`serve_tp` is the real (wall-clock) run of a TP engine, for validation: rank 0 replays the
requests through the shared scheduler and `TPDriverRunner`; the other ranks run `run_worker`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pagesim.config import EngineConfig
from pagesim.gpu.allreduce_bench import DEFAULT_MESSAGE_BYTES, bench_allreduce
from pagesim.gpu.allreduce_bench import METHOD as ALLREDUCE_METHOD
from pagesim.gpu.calibrate import CalibrationGrid, Progress
from pagesim.gpu.graph_check import DEFAULT_SHAPES, graph_vs_eager_rows
from pagesim.gpu.memory import (
    MeasuredKVCapacity,
    MemorySnapshot,
    measure_kv_capacity,
    release_cached,
)
from pagesim.gpu.model import DecoderConfig
from pagesim.gpu.parallel import TPGroup, destroy_tensor_parallel, init_tensor_parallel
from pagesim.gpu.profiler import (
    CalibrationOptions,
    CalibrationResult,
    World,
    block_order,
    calibrate,
    override_capacity,
)
from pagesim.gpu.runner import RunnerConfig, step_record_columns
from pagesim.gpu.serve import make_engine, replay, run_records, serve_result, warm_up
from pagesim.gpu.tp_model import TensorParallelDecoder
from pagesim.gpu.tp_runner import TPDriverRunner, broadcast_stop, run_collective, run_worker


def group_capacity(
    config: EngineConfig,
    model: TensorParallelDecoder,
    before: MemorySnapshot | None,
    group: TPGroup,
    order: tuple[int, ...],
) -> MeasuredKVCapacity:
    """vLLM's start-up measurement on every rank (a collective forward) for the block sizes
    `order`, the smallest block count of the group kept; on a CPU the override is the
    capacity."""
    if model.device.type != "cuda":
        return override_capacity(config, order)
    cap = measure_kv_capacity(config, model, before, order)
    per_rank = group.gather_objects(cap.num_gpu_blocks)
    smallest = {bs: min(blocks[bs] for blocks in per_rank) for bs in order}
    return dataclasses.replace(cap, num_gpu_blocks=smallest)


def calibrate_tensor_parallel(
    group: TPGroup,
    model: TensorParallelDecoder,
    config: EngineConfig,
    grid: CalibrationGrid,
    *,
    before: MemorySnapshot | None = None,
    seed: int = 0,
    calibration_root: str | Path | None = None,
    progress: Progress | None = None,
    time_budget_s: float | None = None,
    log: Callable[[str], None] = print,
    allreduce_bytes: tuple[int, ...] = DEFAULT_MESSAGE_BYTES,
    allreduce_repeats: int = 20,
    cuda_graphs: bool = False,
) -> CalibrationResult | None:
    """Every rank of the group calls this; rank 0 returns the result, the others None.

    `before`: the memory snapshot taken before `model` was built (CUDA); on a CPU,
    `config.num_gpu_blocks_override` is the KV cache (a dry run over gloo).
    """
    t0 = time.monotonic()
    capacity = group_capacity(config, model, before, group, tuple(block_order(config, grid)))
    if not group.is_driver:
        run_worker(group, model, seed=seed)
        return None
    log(capacity.report())
    n = group.world_size
    world = World(
        n,
        allreduce_in_step_times=True,
        method=f" Steps ran on all {n} ranks (rank 0 broadcasts each step; times are rank "
        "0's and include the all-reduces). "
        + ALLREDUCE_METHOD.format(
            dtype=str(model.dtype).removeprefix("torch."),
            backend="NCCL" if model.device.type == "cuda" else "gloo",
            warmup=5,
            repeats=allreduce_repeats,
        ),
        notes=f", tensor_parallel_size {n}: {n} processes; smallest KV block count of the group",
        capacity_notes=False,
    )
    try:
        # the all-reduce table first: a few seconds, and a collective that fails there fails
        # before the grid's minutes are spent
        allreduce = run_collective(
            group, bench_allreduce, allreduce_bytes, dtype=model.dtype, repeats=allreduce_repeats
        )
        return calibrate(
            lambda cfg, blocks: TPDriverRunner(
                group, cfg, blocks, RunnerConfig(seed=seed, cuda_graphs=cuda_graphs), model=model
            ),
            model,
            capacity,
            config,
            grid,
            t0,
            CalibrationOptions(seed, calibration_root, progress, time_budget_s, log, cuda_graphs),
            world,
            tuple(allreduce),
        )
    finally:
        broadcast_stop(group)


def calibration_main(
    rank: int,
    world_size: int,
    init_method: str,
    config: EngineConfig,
    grid: CalibrationGrid,
    dtype: torch.dtype,
    seed: int,
    calibration_root: str | None,
    time_budget_s: float | None,
    device_type: str = "cuda",
    cuda_graphs: bool = False,
) -> None:
    """`launch(calibration_main, N, config, grid, ...)`: one process per GPU (rank r on
    cuda:r), or per CPU process over gloo with `device_type="cpu"` (a dry run)."""
    device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
    group = init_tensor_parallel(rank, world_size, init_method, device)
    try:
        before = MemorySnapshot.take(device) if device.type == "cuda" else None
        model = TensorParallelDecoder(
            DecoderConfig(config.model_spec, dtype, device, config.block_size, seed), group
        )

        def log(msg: str) -> None:
            if group.is_driver:
                print(msg, flush=True)

        result = calibrate_tensor_parallel(
            group,
            model,
            config,
            grid,
            before=before,
            seed=seed,
            calibration_root=calibration_root,
            time_budget_s=time_budget_s,
            log=log,
            cuda_graphs=cuda_graphs,
        )
        if result is not None:
            p = result.profile
            log(
                f"profile: {result.directory} ({len(p.decode)} decode, {len(p.prefill)} "
                f"prefill, {len(p.mixed)} mixed, {len(p.overhead)} overhead, "
                f"{len(p.allreduce)} all-reduce rows) in {result.elapsed_s:.0f} s"
            )
    finally:
        destroy_tensor_parallel()


def serve_tp(
    group: TPGroup,
    model: TensorParallelDecoder,
    config: EngineConfig,
    num_gpu_blocks: int,
    requests: list | None = None,
    *,
    max_wall_s: float | None = None,
    seed: int = 0,
    temperature: float = 1.0,
    cuda_graphs: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A real run of a TP engine. Rank 0 passes the requests and gets (result keys, raw
    records) as `validate.serve_workload` returns them, the runner's per-step records under
    `records["runner_steps"]`; other ranks pass None and get None. As on one GPU, with
    `cuda_graphs` every graph the run can meet is captured on every rank, then a few
    synthetic steps warm up the large shapes, all before the clock starts."""
    if not group.is_driver:
        run_worker(group, model, seed=seed)
        return None
    scheduler = make_engine(config, num_gpu_blocks)
    num_cpu = scheduler.swap_pool.num_blocks if scheduler.swap_pool is not None else 0
    try:
        options = RunnerConfig(
            seed=seed, num_cpu_blocks=num_cpu, temperature=temperature, cuda_graphs=cuda_graphs
        )
        runner = TPDriverRunner(group, config, num_gpu_blocks, options, model=model)
        captured, capture_s = (
            runner.capture_all(max_batch=len(requests or [])) if cuda_graphs else (0, 0.0)
        )
        warm_up(runner, config)
        run = replay(requests or [], scheduler, runner, max_wall_s=max_wall_s)
    finally:
        broadcast_stop(group)
    result = serve_result(run, scheduler, config)
    graphs = runner.graphs
    replayed = graphs is not None and graphs.capture  # a CPU runs the padded path uncaptured
    result["gpu_cuda_graphs"] = replayed and graphs.failed is None
    result["gpu_graphs_captured"] = captured if replayed else 0
    result["gpu_graph_capture_s"] = capture_s if replayed else 0.0
    result["gpu_graph_error"] = graphs.failed if graphs is not None else None
    result["truncated"] = any(
        r.reject_reason == "wall-clock limit" for r in run.metrics.records.values()
    )
    records = run_records(run)
    records["runner_steps"] = step_record_columns(runner.step_records)
    return result, records


def graph_vs_eager_tp(
    group: TPGroup,
    model: TensorParallelDecoder,
    config: EngineConfig,
    num_gpu_blocks: int,
    shapes: dict[str, list[tuple[int, int]]] | None = None,
    *,
    reps: int = 10,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[dict] | None:
    """`gpu.graph_check.graph_vs_eager_rows` on a TP engine: each step replayed as graphs and
    run eagerly, every rank switching together (`TPDriverRunner.use_graphs`). Rank 0 gets the
    rows (host ms per mode, and how far rank 0's final hidden rows part: after the last
    all-reduce they are the group's); other ranks run the worker loop and get None."""
    if not group.is_driver:
        run_worker(group, model, seed=seed)
        return None
    try:
        runner = TPDriverRunner(
            group, config, num_gpu_blocks, RunnerConfig(seed=seed, cuda_graphs=True), model=model
        )
        rows = graph_vs_eager_rows(
            runner, runner.use_graphs, shapes or DEFAULT_SHAPES, reps=reps, log=log
        )
    finally:
        broadcast_stop(group)
    del runner
    release_cached()
    return rows
