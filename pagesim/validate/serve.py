"""The real side of a validation: a workload's requests, drawn as `simulate` draws them,
served in wall-clock time through the shared scheduler and the GPU runner."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagesim.config import EngineConfig
from pagesim.errors import WorkloadError
from pagesim.request import Request
from pagesim.sim.load import LoadSpec, sample_traffic
from pagesim.validate.store import load_spec
from pagesim.workload.sessions import ClosedLoopSessions


def build_traffic(config: EngineConfig, load: LoadSpec) -> list[Request] | ClosedLoopSessions:
    """What `simulate` sends for `load` (`sample_traffic`, its own draw): the requests with
    their arrival times, or for a multi-turn workload its sessions, closed loop (each later
    turn sent when the previous one finished plus its think time, built from the tokens it
    emitted)."""
    plan, arrivals = sample_traffic(load, config.model_spec.vocab_size)
    if plan.is_multi_turn:
        return ClosedLoopSessions(plan, arrivals)
    return [
        sample
        for s in range(plan.num_sessions)
        for sample in plan.samples(plan.session(s).first_request(float(arrivals[s])))
    ]


def build_requests(config: EngineConfig, load: LoadSpec) -> list[Request]:
    """`build_traffic` of a single-turn workload: its requests, all known in advance."""
    traffic = build_traffic(config, load)
    if isinstance(traffic, ClosedLoopSessions):
        raise WorkloadError(
            f"workload={load.workload!r}: multi-turn sessions are closed loop; their later "
            "turns are made as earlier ones finish (build_traffic)"
        )
    return traffic


def serve_workload(
    config: EngineConfig,
    model: Any,
    num_gpu_blocks: int,
    load: dict[str, Any],
    *,
    device: str = "cuda",
    max_wall_s: float | None = None,
    temperature: float = 1.0,
    cuda_graphs: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serve `load` for real (wall clock) with `model` (a `RandomWeightDecoder`) over a KV
    cache of `num_gpu_blocks`; returns (result keys, raw records).

    With `cuda_graphs` (CUDA only) every graph the run can meet (decode batches up to the
    number of requests, every mixed-step size) is captured before the clock starts, and a
    few eager steps warm up the larger shapes (`serve.warm_up`); `gpu_graph_capture_s` and
    `gpu_graphs_captured` in the result say what it cost. The
    runner's per-step records (graph replayed or eager, device times) go under
    `records["runner_steps"]`."""
    from pagesim.gpu.modes import RUNNER_MODES
    from pagesim.gpu.runner import GPUModelRunner, RunnerConfig, step_record_columns
    from pagesim.gpu.serve import make_engine, replay, run_records, serve_result, warm_up

    traffic = build_traffic(config, load_spec(load))
    # at most one request of a session is in flight at a time
    in_flight = traffic.num_sessions if isinstance(traffic, ClosedLoopSessions) else len(traffic)
    model.set_block_size(config.block_size)
    scheduler = make_engine(config, num_gpu_blocks)
    num_cpu = scheduler.swap_pool.num_blocks if scheduler.swap_pool is not None else 0
    options = RunnerConfig(
        device=device, num_cpu_blocks=num_cpu, temperature=temperature, cuda_graphs=cuda_graphs
    )
    runner = GPUModelRunner(config, num_gpu_blocks, options, model=model, log=log)
    graphs = runner.graphs
    captured, capture_s = (
        graphs.capture_all(max_batch=in_flight) if graphs is not None else (0, 0.0)
    )
    warm_up(runner, config)
    run = replay(traffic, scheduler, runner, max_wall_s=max_wall_s)
    result = serve_result(run, scheduler, config)
    result["gpu_cuda_graphs"] = graphs is not None and graphs.failed is None
    result["gpu_graphs_captured"] = captured
    result["gpu_graph_capture_s"] = capture_s
    result["gpu_graph_error"] = graphs.failed if graphs is not None else None
    result["gpu_runner"] = RUNNER_MODES[result["gpu_cuda_graphs"]]
    result["truncated"] = any(
        r.reject_reason == "wall-clock limit" for r in run.metrics.records.values()
    )
    records = run_records(run)
    records["runner_steps"] = step_record_columns(runner.step_records)
    del runner, graphs
    return result, records
