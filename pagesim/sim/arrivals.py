"""Arrival processes, exactly as `vllm bench serve` dispatches requests.

Pure functions over a `numpy.random.Generator`: they return arrival times (seconds from the
start of the run, float64, non-decreasing) and never touch SimPy.

Which process times a run (`session_arrival_times`):

- `request_rate` given (the `--request-rate` flag): it overrides the workload's own process.
  `inf` sends everything at t=0; a finite rate draws inter-arrival gaps
  ~ Gamma(shape=burstiness, scale=1/(rate*burstiness)) (burstiness 1 is Poisson, < 1 burstier,
  > 1 more regular, `inf` evenly spaced), then, as vLLM does when no ramp-up is set, rescales
  the cumulative delays so that the *last* arrival is at exactly `num / rate` (vLLM does this
  "to close the 1-2% gap" between the drawn total and the target; the first arrival is the
  first rescaled gap, not 0). So the empirical rate num/last is exactly `rate`.
- `request_rate` None: the workload's own process (`RequestPlan.arrival`): trace replay
  (timestamps in seconds from the trace's first request, times `time_scale`), or the spec's
  poisson/gamma section (same draws and rescaling as above), or `inf` when it has none.

No process may spread its arrivals over more than `MAX_ARRIVAL_SPAN_S` (1e9 s): the simulated
clock is float64 seconds, and past that it no longer resolves a step's time.

Times are per *session*: a single-turn request is its own session; later turns of multi-turn
sessions arrive in closed loop (finish + think time), decided by the simulator.

`--max-concurrency` is not applied here: like vLLM's semaphore, the simulator holds a request
whose arrival time has come until fewer than max_concurrency requests are in flight, so the
effective rate can be lower than the configured one.
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.errors import WorkloadError
from pagesim.workload import RequestPlan

ARRIVAL_STREAM = 0xA7  # appended to the seed: arrival draws never share a stream with the plan

# The longest span of arrivals a run may have, in simulated seconds. The clock is float64
# seconds: at 1e9 s it still resolves 1.2e-7 s, far below a step's milliseconds; at 1e17 s
# (100 requests at 1e-15 req/s) it resolves 16 s and every step time rounds to nothing.
MAX_ARRIVAL_SPAN_S = 1e9
_PRECISE = f"the {MAX_ARRIVAL_SPAN_S:.0e} s over which the simulated clock stays precise"


def arrival_rng(seed: int) -> np.random.Generator:
    """The Generator that times a run with `--seed seed`."""
    return np.random.default_rng([int(seed), ARRIVAL_STREAM])


def check_rate(request_rate: float, burstiness: float = 1.0) -> None:
    """One-line errors for `--request-rate` (> 0 or inf) and `--burstiness` (> 0)."""
    if (
        isinstance(request_rate, bool)
        or not isinstance(request_rate, int | float)
        or not (request_rate > 0)
    ):
        raise WorkloadError(f"request_rate = {request_rate!r}: must be > 0 (or inf)")
    if (
        isinstance(burstiness, bool)
        or not isinstance(burstiness, int | float)
        or not (burstiness > 0)
    ):
        raise WorkloadError(f"burstiness = {burstiness!r}: must be > 0")


def check_span(
    name: str, rate: float, num: int, of: str, error: type[Exception] = WorkloadError
) -> None:
    """One line naming `name` unless `num` arrivals at `rate` per second (> 0, or inf) span at
    most `MAX_ARRIVAL_SPAN_S`; `of` says what `num` counts, e.g. `num_prompts=100`."""
    least = num / MAX_ARRIVAL_SPAN_S
    if rate < least:  # compares rates: the smallest one printed passes when given back
        span = num / rate  # inf past the largest float
        raise error(
            f"{name}={rate!r}: {num} arrivals would span {_seconds(span)}, more than "
            f"{_PRECISE}; the smallest {name} for {of} is {least!r}"
        )


def _seconds(span: float) -> str:
    return f"{span:.3g} s" if math.isfinite(span) else "over 1e308 s"


def rate_arrival_times(
    num: int, request_rate: float, burstiness: float, rng: np.random.Generator
) -> np.ndarray:
    """`vllm bench serve` arrival times of `num` requests at `request_rate` req/s.

    Returns float64 [num]. See the module docstring for the gamma gaps and the rescaling.
    """
    check_rate(request_rate, burstiness)
    if isinstance(num, bool) or not isinstance(num, int | np.integer) or num < 1:
        raise WorkloadError(f"num_prompts = {num!r}: must be an integer >= 1")
    if math.isinf(request_rate):
        return np.zeros(num, dtype=np.float64)
    if math.isinf(burstiness):
        gaps = np.full(num, 1.0 / request_rate)  # constant gaps; the rescale is then exact
    else:
        theta = 1.0 / (request_rate * burstiness)
        gaps = rng.gamma(shape=burstiness, scale=theta, size=num)
    delays = np.cumsum(gaps)
    if delays[-1] != 0:
        delays = delays * ((num / request_rate) / delays[-1])
    return delays


def trace_arrival_times(timestamps_s: np.ndarray, time_scale: float = 1.0) -> np.ndarray:
    """Trace replay: seconds from the first request, stretched by `time_scale` (> 1 slower)."""
    if (
        isinstance(time_scale, bool)
        or not isinstance(time_scale, int | float)
        or not (0 < time_scale < math.inf)
    ):
        raise WorkloadError(f"time_scale = {time_scale!r}: must be > 0")
    t = np.asarray(timestamps_s, dtype=np.float64)
    if not len(t):
        return t
    length = float(t[-1] - t[0])
    if length > 0 and time_scale > MAX_ARRIVAL_SPAN_S / length:
        raise WorkloadError(
            f"time_scale = {time_scale!r}: {len(t)} trace arrivals over {length:.3g} s would "
            f"span {_seconds(length * time_scale)}, more than {_PRECISE}; the largest "
            f"time_scale for them is {MAX_ARRIVAL_SPAN_S / length!r}"
        )
    return (t - t[0]) * float(time_scale)


def session_arrival_times(
    plan: RequestPlan,
    request_rate: float | None = None,
    burstiness: float | None = None,
    seed: int | None = None,
) -> np.ndarray:
    """Arrival time of each session's first request: float64 [plan.num_sessions].

    request_rate None uses the workload's own process; burstiness None means the spec's (or
    1.0); it is ignored by trace replay and by `inf`. seed defaults to the plan's seed.
    """
    rng = arrival_rng(plan.seed if seed is None else seed)
    n = plan.num_sessions
    if request_rate is not None:
        return rate_arrival_times(n, request_rate, 1.0 if burstiness is None else burstiness, rng)
    own = plan.arrival
    if own.process == "trace" and plan.trace_times_s is not None:
        return trace_arrival_times(plan.trace_times_s, own.time_scale)
    if own.process in ("poisson", "gamma") and own.rate is not None:
        b = own.burstiness if burstiness is None else burstiness
        check_span(f"workload {plan.name!r} arrival.rate", own.rate, n, f"{n} sessions")
        return rate_arrival_times(n, own.rate, b, rng)
    return np.zeros(n, dtype=np.float64)
