"""Per-request and per-step records of a run, collected on the simulator's hot path.

Definitions follow `vllm bench serve` (per successful request): TTFT = first token time -
arrival; TPOT = (E2E - TTFT) / (output_len - 1) for output_len > 1; ITL = every gap between
consecutive tokens of a request, pooled over requests; E2E = finish - arrival. Queueing time
is first scheduled - arrival (vLLM's QUEUED -> SCHEDULED interval).

Storage is columnar (`array`) so that 100k requests and millions of token gaps stay compact;
the pooled gaps are kept as runs of equal gaps (a step of n decodes adds n equal ones).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

from pagesim.errors import PagesimError
from pagesim.metrics.runs import expand
from pagesim.request import Request


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


STEP_COLUMNS: tuple[str, ...] = (
    "start_time_s",  # simulated time the step began
    "step_time_s",  # its duration from the cost model (or the GPU)
    "num_reqs",  # requests in the batch
    "num_tokens",  # tokens computed (prefill chunks + decodes)
    "num_prefill_tokens",  # tokens of requests that are not in the decode shape
    "num_decode_reqs",  # requests in the decode shape (1 new token on a context)
    "num_running",  # running requests after the step's scheduling
    "num_waiting",  # waiting (incl. preempted and swapped) requests
    "kv_usage",  # used / usable blocks (paged) or slots (contiguous)
    "kv_token_state_frac",  # waste breakdown, fractions of KV memory
    "kv_reserved_frac",
    "kv_internal_frag_frac",
    "kv_external_frag_frac",
    "num_preempted",  # preemptions decided in this step
    "swap_bytes",  # bytes over the host link this step
)


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
    # Per-step values, one step's `STEP_COLUMNS` after the other's (one C call per step);
    # `steps` gives them by column.
    step_values: array = field(default_factory=lambda: array("d"))

    def on_arrival(self, request: Request, now: float) -> None:
        self.records[request.request_id] = RequestRecord(
            request_id=request.request_id,
            arrival_time=now,
            num_prompt_tokens=request.num_prompt_tokens,
            max_tokens=request.max_tokens,
            session_id=request.session_id,
            cache_salt=request.cache_salt,
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

    def on_token(self, rec: RequestRecord, now: float) -> None:
        """One output token of `rec`'s request became visible to the client at `now`."""
        if rec.first_token_time is None:
            rec.first_token_time = now
        else:
            self.itl_run_s.append(now - rec.last_token_time)  # type: ignore[operator]
            self.itl_run_counts.append(1)
        rec.last_token_time = now
        rec.num_output_tokens += 1
        self.on_tokens_visible(now, 1)

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

    def on_step(self, values: tuple[float, ...]) -> None:
        """Append one step's values, in `STEP_COLUMNS` order (each stored as a float64)."""
        self.step_values.extend(values)

    @property
    def steps(self) -> dict[str, array]:
        """Column -> its values over the steps, in order (new arrays, `STEP_COLUMNS` order)."""
        table = self._step_table()
        return {c: array("d", table[:, i].tobytes()) for i, c in enumerate(STEP_COLUMNS)}

    def step_column(self, name: str) -> np.ndarray:
        """One column of `steps` as a new contiguous float64 array."""
        return np.ascontiguousarray(self._step_table()[:, STEP_COLUMNS.index(name)])

    def _step_table(self) -> np.ndarray:
        flat = np.frombuffer(self.step_values, dtype=np.float64)
        if flat.size % len(STEP_COLUMNS):
            raise PagesimError(
                f"step_values: {flat.size} values are not whole steps of {len(STEP_COLUMNS)}"
            )
        return flat.reshape(-1, len(STEP_COLUMNS))

    @property
    def num_steps(self) -> int:
        return len(self.step_values) // len(STEP_COLUMNS)
