"""Tensor-parallel execution: the scheduler on rank 0, its output broadcast, a worker loop.

As vLLM runs a TP engine: rank 0 (the driver) owns the `Scheduler`; every step it broadcasts
what the step needs and then executes its own shard; the other ranks (workers) receive the
same step and execute their shards. The shards meet in the all-reduces inside the forward
pass, so every rank runs every step, in the same order, on the same inputs.

    rank 0:   out = scheduler.schedule()
              TPDriverRunner.execute_model(out):  broadcast(encode(out)); local runner(out)
              scheduler.update_from_output(...)
    rank r:   run_worker: msg = broadcast(); out = decode(msg); local runner(out)

`TPDriverRunner` implements the `ModelRunner` protocol, so the serve loop (`gpu.serve.replay`)
and the calibration grid (`gpu.calibrate`) drive a TP engine unchanged.

What is broadcast (`StepMessage`), like vLLM's new/cached request split: the prompt of a
request the workers have not seen (once), then per step and scheduled request only its counts,
the output tokens appended since the last step and the step's block ids as the scheduler sent
them (each rank's runner keeps its own rows). Workers keep a mirror `Request` per request and
rebuild a real `SchedulerOutput` from it, so their `GPUModelRunner` is the very same code as rank
0's. Swap and copy-on-write block lists travel as they are (each rank moves its own KV shard).
Control messages reconfigure the workers' runner (`Configure`), run a collective benchmark
(`RunCollective`), capture CUDA graphs (`CaptureGraphs`), switch between graph replay and eager
steps (`UseGraphs`) or end the loop (`Stop`).

On a CPU a runner asked for graphs gets the padded static-buffer path without capture
(`StepGraphs(capture=False)`), so the flow of a graph run (padding, capture messages, the
switch) is the same over gloo as over NCCL; only the capture itself needs CUDA.
"""

from __future__ import annotations

import gc
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagesim.config import EngineConfig
from pagesim.errors import InternalError
from pagesim.gpu.memory import release_cached
from pagesim.gpu.parallel import TPGroup
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
from pagesim.request import Request
from pagesim.scheduler.output import ModelRunnerOutput, ScheduledRequest, SchedulerOutput


@dataclass(slots=True)
class StepEntry:
    """One scheduled request of a broadcast step (deltas against what the workers hold)."""

    key: int  # the request's wire key (see `StepEncoder`)
    num_new_tokens: int
    num_computed_tokens: int
    keep_output: int  # output tokens the worker keeps; then `new_output` is appended
    new_output: list[int]
    block_ids: list[int] | None  # as `ScheduledRequest`: a whole row, or None and
    new_block_ids: list[int]  # the ids appended to the worker runner's row


#: The `SchedulerOutput` fields a step message carries as rank 0 holds them: its requests
#: travel as `StepEntry` deltas, and the rejected ids concern only the scheduler's caller.
STEP_FIELDS = (
    "step_id",
    "total_num_scheduled_tokens",
    "block_size",
    "finished_req_ids",
    "preempted_req_ids",
    "blocks_to_copy",
    "blocks_to_swap_out",
    "blocks_to_swap_in",
    "swap_bytes",
)
_step_fields = operator.attrgetter(*STEP_FIELDS)


@dataclass(slots=True)
class StepMessage:
    """Everything a worker needs to execute one step exactly as rank 0 does."""

    step_fields: tuple  # rank 0's `SchedulerOutput` values of `STEP_FIELDS`, as they are
    skip_attention: bool  # calibration's attention-off timing, mirrored on every rank
    # (key, request_id, prompt_token_ids, max_tokens) of requests the workers have not seen
    new_requests: list[tuple[int, str, list[int], int]]
    entries: list[StepEntry]
    finished_keys: list[int]  # wire keys of the step's finished_req_ids


@dataclass(frozen=True)
class Configure:
    """Build a new local runner on every worker (a block size, a KV cache size)."""

    config: EngineConfig
    num_gpu_blocks: int
    num_cpu_blocks: int = 0
    temperature: float = 1.0
    cuda_graphs: bool = False


@dataclass(frozen=True)
class RunCollective:
    """Every rank calls `fn(group, *args, **kwargs)` (an importable function), e.g. the
    all-reduce benchmark; rank 0 keeps the result."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CaptureGraphs:
    """Every rank captures its runner's CUDA graphs now, in the same key order, so that the
    NCCL all-reduces inside them are captured in lockstep (`StepGraphs.capture_all`)."""

    max_batch: int | None = None


@dataclass(frozen=True)
class UseGraphs:
    """Every rank replays its graphs (`on`) or runs its steps eagerly from the next step on,
    so that one runner can time a step both ways (`gpu.graph_check`)."""

    on: bool


@dataclass(frozen=True)
class Stop:
    """End the worker loop."""


@dataclass(slots=True)
class _Held:
    """What the workers hold of one request: its wire key and output tokens."""

    request: Request
    key: int
    num_outputs: int = 0


class StepEncoder:
    """Rank 0: `SchedulerOutput` -> `StepMessage`, remembering what the workers hold.

    Every request *object* gets a wire key when first scheduled, and the workers keep a mirror
    per key: request ids may repeat across objects (benchmarks' synthetic steps reuse
    `cal-0` ... across steps they interleave), and a repeated step then costs no resend. A
    request's state is dropped when its id appears in `finished_req_ids`.
    """

    def __init__(self) -> None:
        self._held: dict[int, _Held] = {}  # id(request object) -> held state (keeps it alive)
        self._current: dict[str, int] = {}  # request_id -> id() of its latest object
        self._next_key = 0

    def encode(self, out: SchedulerOutput, skip_attention: bool = False) -> StepMessage:
        finished_keys = []
        for rid in out.finished_req_ids:
            obj = self._current.pop(rid, None)
            if obj is not None:
                finished_keys.append(self._held.pop(obj).key)
        new: list[tuple[int, str, list[int], int]] = []
        entries: list[StepEntry] = []
        for sr in out.scheduled:
            req = sr.request
            h = self._held.get(id(req))
            if h is None:
                h = self._held[id(req)] = _Held(req, self._next_key)
                self._next_key += 1
                new.append((h.key, req.request_id, req.prompt_token_ids, req.max_tokens))
            self._current[req.request_id] = id(req)
            output = req.output_token_ids
            keep_out = min(h.num_outputs, len(output))
            entries.append(
                StepEntry(
                    h.key,
                    sr.num_new_tokens,
                    sr.num_computed_tokens,
                    keep_out,
                    output[keep_out:],
                    sr.block_ids,  # type: ignore[arg-type]  # one KV cache group
                    sr.new_block_ids,  # type: ignore[arg-type]
                )
            )
            h.num_outputs = len(output)
        return StepMessage(_step_fields(out), skip_attention, new, entries, finished_keys)


class StepDecoder:
    """Workers: `StepMessage` -> the `SchedulerOutput` rank 0 executes, over mirror requests
    (`requests`: wire key -> mirror)."""

    def __init__(self) -> None:
        self.requests: dict[int, Request] = {}

    def decode(self, msg: StepMessage) -> SchedulerOutput:
        for key in msg.finished_keys:
            del self.requests[key]
        for key, rid, prompt, max_tokens in msg.new_requests:
            self.requests[key] = Request(rid, prompt, max_tokens=max_tokens)
        out = SchedulerOutput(**dict(zip(STEP_FIELDS, msg.step_fields, strict=True)))
        for e in msg.entries:
            req = self.requests[e.key]
            output = req.output_token_ids
            if e.keep_output > len(output):
                raise InternalError(
                    f"request_id={req.request_id!r}: worker holds {len(output)} "
                    f"output tokens, rank 0 assumed {e.keep_output}"
                )
            del output[e.keep_output :]
            output.extend(e.new_output)
            out.scheduled.append(
                ScheduledRequest(
                    req, e.num_new_tokens, e.num_computed_tokens, e.block_ids, e.new_block_ids
                )
            )
        return out


class _LocalSwitch:
    """A switch of the driver that lives on its local runner. `__getattr__` forwards reads
    only: a write (calibration's `skip_attention`, a benchmark's `record_steps`) must reach the
    runner that executes the step, not land on the driver."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, driver: TPDriverRunner, owner: type | None = None) -> bool:
        return getattr(driver.local, self.name)

    def __set__(self, driver: TPDriverRunner, value: bool) -> None:
        setattr(driver.local, self.name, value)


class TPDriverRunner:
    """Rank 0's `ModelRunner`: broadcast the step, then run the local shard.

    Creating one broadcasts `Configure`, so the workers build the matching runner; attribute
    reads fall through to the local `GPUModelRunner` (`num_gpu_blocks`, `step_records`, ...).
    `options` are the local runner's and every worker's (`RunnerConfig`: its seed, CPU blocks,
    temperature and graphs; the device is the model's).

    With `cuda_graphs` (on every rank alike) the NCCL all-reduces run inside the captured
    graphs, which every rank must capture at the same step: graphs are captured lazily by the
    steps every rank runs alike, or all at once by `capture_all` before a served run's clock
    starts. Off by default here; the commands turn it on (`pagesim calibrate`, unless
    --enforce-eager).
    """

    def __init__(
        self,
        group: TPGroup,
        config: EngineConfig,
        num_gpu_blocks: int,
        options: RunnerConfig,
        *,
        model,
    ) -> None:
        if not group.is_driver:
            raise InternalError(f"rank {group.rank}: only rank 0 drives the engine")
        self.group = group
        self.encoder = StepEncoder()
        msg = Configure(
            config, num_gpu_blocks, options.num_cpu_blocks, options.temperature, options.cuda_graphs
        )
        group.broadcast_object(msg)
        self.slot = LocalRunner()
        self.local = self.slot.configure(msg, model, options.seed)

    def capture_all(self, max_batch: int | None = None) -> tuple[int, float]:
        """Capture every graph a run of at most `max_batch` requests can meet, on every rank
        (`CaptureGraphs`); returns rank 0's (graphs captured, seconds), (0, 0.0) without
        graphs."""
        self.group.broadcast_object(CaptureGraphs(max_batch))
        graphs = self.local.graphs
        return graphs.capture_all(max_batch) if graphs is not None else (0, 0.0)

    def use_graphs(self, on: bool) -> None:
        """Replay graphs (`on`) or run eagerly from the next step on, on every rank."""
        self.group.broadcast_object(UseGraphs(on))
        self.slot.use_graphs(on)

    def __getattr__(self, name: str) -> Any:  # only called for names not found on self
        local = self.__dict__.get("local")
        if local is None:
            raise AttributeError(name)
        return getattr(local, name)

    skip_attention = _LocalSwitch()
    record_steps = _LocalSwitch()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        msg = self.encoder.encode(scheduler_output, self.local.skip_attention)
        self.group.broadcast_object(msg)
        return self.local.execute_model(scheduler_output)


def broadcast_stop(group: TPGroup) -> None:
    """Rank 0: end the workers' loops."""
    group.broadcast_object(Stop())


def run_collective(group: TPGroup, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Rank 0: have every rank (itself included) call `fn(group, *args, **kwargs)`; returns
    rank 0's result. The arguments reach the other ranks as rank 0 pickled them, so none may
    be rank 0's own (a `cuda:0` device would send every rank's collective to GPU 0)."""
    group.broadcast_object(RunCollective(fn, args, kwargs))
    return fn(group, *args, **kwargs)


@dataclass
class WorkerReport:
    """What a worker did, for tests and logs."""

    num_steps: int = 0
    num_configures: int = 0


def run_worker(group: TPGroup, model, *, seed: int = 0) -> WorkerReport:
    """Ranks > 0: execute broadcast steps with `model` (this rank's shard) until `Stop`."""
    if group.is_driver:
        raise InternalError("rank 0 drives the engine; run_worker is for ranks > 0")
    report = WorkerReport()
    slot = LocalRunner()
    decoder = StepDecoder()
    while True:
        msg = group.broadcast_object(None)
        if isinstance(msg, Stop):
            return report
        runner = slot.runner
        if isinstance(msg, Configure):
            runner = None  # this reference too: nothing may keep the old KV cache alive
            runner = slot.configure(msg, model, seed)
            runner.record_steps = False
            decoder = StepDecoder()
            report.num_configures += 1
        elif isinstance(msg, RunCollective):
            msg.fn(group, *msg.args, **msg.kwargs)
        elif isinstance(msg, CaptureGraphs):
            if runner is None:
                raise InternalError("a graph capture arrived before any Configure")
            if runner.graphs is not None:
                runner.graphs.capture_all(msg.max_batch)
        elif isinstance(msg, UseGraphs):
            slot.use_graphs(msg.on)  # raises, as the branches here do, before any Configure
        elif isinstance(msg, StepMessage):
            if runner is None:
                raise InternalError("a step arrived before any Configure")
            out = decoder.decode(msg)
            runner.skip_attention = msg.skip_attention
            runner.execute_model(out)
            report.num_steps += 1
        else:
            raise InternalError(f"unknown message {type(msg).__name__}")


class LocalRunner:
    """A rank's own `GPUModelRunner` and its graphs, which `use_graphs(False)` sets aside.

    `configure` drops the previous runner, and the graphs set aside with it, before building
    the next: both hold the old KV cache, and one rank's cache is most of a GPU, so the old
    and the new cannot coexist. Asked for graphs on a CPU, the runner gets the padded
    static-buffer path without capture (see the module docstring)."""

    def __init__(self) -> None:
        self.runner: GPUModelRunner | None = None
        self.graphs = None

    def configure(self, msg: Configure, model, seed: int) -> GPUModelRunner:
        self.runner = self.graphs = None
        gc.collect()  # a captured graph's objects may sit in reference cycles
        release_cached(model.device)
        options = RunnerConfig(
            device=model.device,
            seed=seed,
            num_cpu_blocks=msg.num_cpu_blocks,
            temperature=msg.temperature,
            cuda_graphs=msg.cuda_graphs,
            capture_graphs=model.device.type == "cuda",
        )
        runner = GPUModelRunner(msg.config, msg.num_gpu_blocks, options, model=model)
        self.runner, self.graphs = runner, runner.graphs
        return runner

    def use_graphs(self, on: bool) -> None:
        if self.runner is None:
            raise InternalError("a graph switch arrived before any Configure")
        self.runner.graphs = self.graphs if on else None
