"""Per-request and per-step records of a run, collected on the simulator's hot path.

Definitions follow `vllm bench serve` (per successful request): TTFT = first token time -
arrival; TPOT = (E2E - TTFT) / (output_len - 1) for output_len > 1; ITL = every gap between
consecutive tokens of a request, pooled over requests; E2E = finish - arrival. Queueing time
is first scheduled - arrival (vLLM's QUEUED -> SCHEDULED interval).

Storage is columnar (`array`) so that 100k requests and millions of token gaps stay compact;
the pooled gaps are kept as runs of equal gaps (a step of n decodes adds n equal ones).
"""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np

from pagesim.errors import InternalError
from pagesim.metrics.runs import expand
from pagesim.request import Request


class StepEntry(Protocol):
    """What a step record reads of one scheduled request (`scheduler.output.ScheduledRequest`;
    metrics sits below the scheduler in the layer table, so it names the shape, not the type)."""

    request: Request
    num_computed_tokens: int


class StepOutput(Protocol):
    """What a step record reads of a step's `scheduler.output.SchedulerOutput`."""

    total_num_scheduled_tokens: int
    swap_bytes: int

    @property
    def scheduled(self) -> Sequence[StepEntry]: ...

    @property
    def preempted_req_ids(self) -> Sequence[str]: ...

    @property
    def num_decodes(self) -> int: ...


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; times in seconds of simulated time."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0  # prefix-cache hit at first admission, in tokens
    num_preemptions: int = 0
    reject_reason: str | None = None
    session_id: str | None = None
    cache_salt: str | None = None
    parent_request_id: str | None = None  # the prompt this is a sample of (n > 1)


class StepMetricsRow(NamedTuple):
    """One engine step, as `MetricsCollector.on_step` stores it (every field as a float64).

    A NamedTuple because its tuple is the stored row: `on_step` appends it in one C call.
    Both worlds' engines build it through `of_step`.
    """

    start_time_s: float  # simulated time the step began
    step_time_s: float  # its duration from the cost model (or the GPU)
    num_reqs: int  # requests in the batch
    num_tokens: int  # tokens computed (prefill chunks + decodes)
    num_prefill_tokens: int  # tokens of requests that are not in the decode shape
    num_decode_reqs: int  # requests in the decode shape (1 new token on a context)
    num_running: int  # running requests after the step's scheduling
    num_waiting: int  # waiting (incl. preempted and swapped) requests
    kv_usage: float  # used / usable blocks (paged) or slots (contiguous)
    kv_token_state_frac: float  # waste breakdown, fractions of KV memory
    kv_reserved_frac: float
    kv_internal_frag_frac: float
    kv_external_frag_frac: float
    num_preempted: int  # preemptions decided in this step
    swap_bytes: int  # bytes over the host link this step

    @classmethod
    def of_step(
        cls,
        start_time_s: float,
        step_time_s: float,
        out: StepOutput | None,
        request_counts: tuple[int, int],
        kv: tuple[float, float, float, float, float],
        num_bulk: int = 0,
    ) -> StepMetricsRow:
        """The record of a step that ran `out`'s entries (None: none) after `num_bulk` bulk
        decodes the simulator ran outside it; `request_counts` is the
        scheduler's (running, waiting) after the step, `kv` its KV probe's values. Decode
        entries have one token each, so the rest of the step's tokens are prefill tokens."""
        reqs = tokens = decode = preempted = swap = 0
        if out is not None:
            reqs, tokens, swap = len(out.scheduled), out.total_num_scheduled_tokens, out.swap_bytes
            decode, preempted = out.num_decodes, len(out.preempted_req_ids)
        step = (start_time_s, step_time_s, reqs + num_bulk, tokens + num_bulk, tokens - decode)
        return cls(*step, decode + num_bulk, *request_counts, *kv, preempted, swap)


STEP_COLUMNS: tuple[str, ...] = StepMetricsRow._fields
# Steps kept in memory before they go to the spill file (1,966,080 bytes a chunk).
SPILL_STEPS = 1 << 14


@dataclass
class MetricsCollector:
    """Collects records during a run; the simulator calls one method per event."""

    records: dict[str, RequestRecord] = field(default_factory=dict)
    # Pooled inter-token gaps, in order, as runs: `itl_run_s[i]` repeated `itl_run_counts[i]`
    # times (`itl_s` expands them; `pagesim.metrics.runs` summarises them without expanding).
    itl_run_s: array = field(default_factory=lambda: array("d"))
    itl_run_counts: array = field(default_factory=lambda: array("q"))
    # When output tokens became visible: one entry per distinct time (a step's end), with the
    # number of tokens seen then; vllm bench's peak output tok/s buckets each token by its time.
    token_times_s: array = field(default_factory=lambda: array("d"))
    token_counts: array = field(default_factory=lambda: array("q"))
    # Per-step values, one step's `STEP_COLUMNS` after the other's (one C call per step), the
    # latest steps only: every `SPILL_STEPS` steps they move to `step_spill`, an anonymous
    # temporary file, so that a run of millions of steps holds a few MB of them in memory.
    # `steps` and `step_column` read both back, in order.
    step_values: array = field(default_factory=lambda: array("d"))
    step_spill: StepSpill = field(default_factory=lambda: StepSpill())

    def on_arrival(self, request: Request, now: float) -> None:
        self.records[request.request_id] = RequestRecord(
            request_id=request.request_id,
            arrival_time=now,
            num_prompt_tokens=request.num_prompt_tokens,
            max_tokens=request.max_tokens,
            session_id=request.session_id,
            cache_salt=request.cache_salt,
            parent_request_id=request.parent_request_id,
        )

    def on_reject(self, request: Request, now: float) -> None:
        rec = self.records[request.request_id]
        rec.reject_reason = request.reject_reason or "rejected"
        rec.finish_time = now

    def on_first_scheduled(self, request: Request, now: float) -> None:
        rec = self.records[request.request_id]
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = now
            rec.num_cached_tokens = request.num_cached_tokens or 0

    def on_scheduled(self, scheduled: Sequence[StepEntry], now: float) -> None:
        """A step starting at `now` runs `scheduled`: note each admission's first step (its
        context is still its prefix-cache hit)."""
        for sr in scheduled:
            request = sr.request
            if sr.num_computed_tokens == (request.num_cached_tokens or 0):
                self.on_first_scheduled(request, now)

    def on_token(self, rec: RequestRecord, now: float) -> None:
        """One output token of `rec`'s request became visible to the client at `now`."""
        self.on_tokens((rec.request_id,), now)

    def on_tokens(self, request_ids: Collection[str], now: float, num_pooled: int = 0) -> None:
        """One output token of each of `request_ids` became visible at `now`, together with
        `num_pooled` tokens whose gaps `on_gaps` has already recorded (one visibility)."""
        records, gaps, counts = self.records, self.itl_run_s, self.itl_run_counts
        for request_id in request_ids:
            rec = records[request_id]
            last = rec.last_token_time
            if last is None:
                rec.first_token_time = now
            else:
                gaps.append(now - last)
                counts.append(1)
            rec.last_token_time = now
            rec.num_output_tokens += 1
        if request_ids or num_pooled:
            self.on_tokens_visible(now, len(request_ids) + num_pooled)

    def on_gaps(self, gap_s: float, count: int) -> None:
        """`count` inter-token gaps of `gap_s` seconds each, pooled in order (count >= 1)."""
        self.itl_run_s.append(gap_s)
        self.itl_run_counts.append(count)

    @property
    def itl_s(self) -> array:
        """Every pooled inter-token gap in order (seconds; a new array of the expanded runs)."""
        return array(
            "d",
            expand(
                np.frombuffer(self.itl_run_s, dtype=np.float64),
                np.frombuffer(self.itl_run_counts, dtype=np.int64),
            ).tobytes(),
        )

    def on_tokens_visible(self, now: float, count: int) -> None:
        """`count` output tokens (of any requests) became visible at `now` (non-decreasing)."""
        times = self.token_times_s
        if times and times[-1] == now:
            self.token_counts[-1] += count
        else:
            times.append(now)
            self.token_counts.append(count)

    def on_finish(self, request: Request, now: float) -> None:
        rec = self.records[request.request_id]
        rec.finish_time = now
        rec.num_preemptions = request.num_preemptions

    def on_step(self, record: StepMetricsRow) -> None:
        """Record one step (`StepMetricsRow.of_step`)."""
        values = self.step_values
        values.extend(record)
        if len(values) >= _SPILL_VALUES:
            self.step_spill.write(values)
            del values[:]

    @property
    def steps(self) -> dict[str, array]:
        """Column -> its values over the steps, in order (new arrays, `STEP_COLUMNS` order)."""
        return {c: array("d", self.step_column(c).tobytes()) for c in STEP_COLUMNS}

    def step(self, index: int) -> StepMetricsRow:
        """One step's record (for tests and inspection; reads the spill file if needed)."""
        return StepMetricsRow(*(float(self.step_column(c)[index]) for c in STEP_COLUMNS))  # type: ignore[arg-type]  # all stored as float64

    def step_tables(self) -> Iterator[np.ndarray]:
        """The steps in order as [steps, len(STEP_COLUMNS)] tables, a spill chunk at a time
        (the memory of one chunk, whatever the run's length)."""
        yield from self.step_spill.chunks()
        yield _as_table(self.step_values)

    def step_column(self, name: str) -> np.ndarray:
        """One column of `steps` as a new contiguous float64 array [num_steps]."""
        i = STEP_COLUMNS.index(name)
        tail = _as_table(self.step_values)
        return np.concatenate([*self.step_spill.columns(i), tail[:, i]])

    def extend_steps(self, other: MetricsCollector) -> None:
        """Append `other`'s steps after this collector's (replicas merged into one)."""
        self.step_spill.write(self.step_values)
        del self.step_values[:]
        for chunk in other.step_spill.chunks():
            self.step_spill.write(array("d", chunk.tobytes()))
        self.step_spill.write(other.step_values)

    @property
    def num_steps(self) -> int:
        return self.step_spill.num_steps + len(self.step_values) // len(STEP_COLUMNS)


_SPILL_VALUES = SPILL_STEPS * len(STEP_COLUMNS)


def _as_table(values: array | np.ndarray) -> np.ndarray:
    flat = np.frombuffer(values, dtype=np.float64) if isinstance(values, array) else values
    if flat.size % len(STEP_COLUMNS):
        raise InternalError(
            f"step values: {flat.size} values are not whole steps of {len(STEP_COLUMNS)}"
        )
    return flat.reshape(-1, len(STEP_COLUMNS))


class StepSpill:
    """Whole chunks of step rows in an anonymous temporary file (deleted when closed or
    collected), appended in order and read back a chunk at a time."""

    def __init__(self) -> None:
        self.file: Any = None  # opened on the first chunk: short runs never touch the disk
        self.num_steps = 0
        self.chunk_steps: list[int] = []

    def write(self, values: array) -> None:
        if not values:
            return
        if self.file is None:
            self.file = tempfile.TemporaryFile(prefix="pagesim-steps-")
        self.file.seek(0, 2)
        values.tofile(self.file)
        n = len(values) // len(STEP_COLUMNS)
        self.chunk_steps.append(n)
        self.num_steps += n

    def chunks(self) -> Iterator[np.ndarray]:
        """Each chunk as a [steps, len(STEP_COLUMNS)] table, in order."""
        if self.file is None:
            return
        self.file.flush()
        self.file.seek(0)
        for n in self.chunk_steps:
            flat = np.fromfile(self.file, dtype=np.float64, count=n * len(STEP_COLUMNS))
            yield _as_table(flat)

    def columns(self, i: int) -> Iterator[np.ndarray]:
        for table in self.chunks():
            yield table[:, i].copy()

    def __getstate__(self) -> dict[str, Any]:  # a collector crossing processes takes its rows
        return {"tables": [t.copy() for t in self.chunks()]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]
        for t in state["tables"]:
            self.write(array("d", t.tobytes()))
