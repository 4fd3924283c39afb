"""Arrival processes as `vllm bench serve` makes them: inf, Poisson/gamma with burstiness and
the rescaling of the last arrival to num/rate, trace replay, and which process wins."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pagesim.errors import WorkloadError
from pagesim.sim.arrivals import (
    MAX_ARRIVAL_SPAN_S,
    arrival_rng,
    check_span,
    rate_arrival_times,
    session_arrival_times,
    trace_arrival_times,
)
from pagesim.workload import load_workload


def test_inf_rate_sends_everything_at_zero() -> None:
    t = rate_arrival_times(100, math.inf, 1.0, arrival_rng(0))
    assert t.shape == (100,) and not t.any()


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_last_arrival_is_rescaled_to_num_over_rate(burstiness: float) -> None:
    n, rate = 5000, 8.0
    t = rate_arrival_times(n, rate, burstiness, arrival_rng(1))
    assert t[-1] == pytest.approx(n / rate, rel=1e-12)  # vLLM's target_total_delay_s
    assert np.all(np.diff(t) >= 0) and t[0] > 0  # the first arrival is a (rescaled) gap
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)


def test_burstiness_orders_the_gap_variance() -> None:
    """Gamma(b, 1/(rate b)) gaps have CV^2 = 1/b: burstier below 1, more regular above."""
    cv2 = {}
    for b in (0.25, 1.0, 4.0):
        gaps = np.diff(rate_arrival_times(20000, 10.0, b, arrival_rng(2)))
        cv2[b] = gaps.var() / gaps.mean() ** 2
    assert cv2[0.25] > cv2[1.0] > cv2[4.0]
    assert cv2[1.0] == pytest.approx(1.0, rel=0.1)  # Poisson: exponential gaps
    assert cv2[0.25] == pytest.approx(4.0, rel=0.15)


def test_infinite_burstiness_is_evenly_spaced() -> None:
    t = rate_arrival_times(10, 2.0, math.inf, arrival_rng(0))
    assert np.allclose(t, np.arange(1, 11) / 2.0)


def test_same_seed_same_times_and_seed_matters() -> None:
    a = rate_arrival_times(50, 3.0, 0.5, arrival_rng(7))
    assert np.array_equal(a, rate_arrival_times(50, 3.0, 0.5, arrival_rng(7)))
    assert not np.array_equal(a, rate_arrival_times(50, 3.0, 0.5, arrival_rng(8)))


@pytest.mark.parametrize(
    ("rate", "burstiness", "needle"),
    [
        (0.0, 1.0, "request_rate = 0.0"),
        (-1.0, 1.0, "request_rate = -1.0"),
        (math.nan, 1.0, "request_rate = nan"),
        (2.0, 0.0, "burstiness = 0.0"),
        (2.0, -3.0, "burstiness = -3.0"),
    ],
)
def test_bad_rates(rate: float, burstiness: float, needle: str) -> None:
    with pytest.raises(WorkloadError, match=needle):
        rate_arrival_times(10, rate, burstiness, arrival_rng(0))


def test_trace_replay_and_time_scale() -> None:
    assert trace_arrival_times(np.array([2.0, 3.0, 7.0]), 2.0).tolist() == [0.0, 2.0, 10.0]
    with pytest.raises(WorkloadError, match="time_scale = 0"):
        trace_arrival_times(np.array([0.0]), 0)


def test_arrivals_may_span_a_billion_seconds_and_no_more() -> None:
    """The float64 clock resolves 1.2e-7 s at 1e9 s; the smallest rate the error names passes."""
    check_span("request_rate", 1e-7, 100, "num_prompts=100")
    check_span("request_rate", math.inf, 100, "num_prompts=100")
    with pytest.raises(WorkloadError, match="the smallest request_rate for num_prompts=7 is"):
        check_span("request_rate", 6.9e-9, 7, "num_prompts=7")
    with pytest.raises(WorkloadError, match="largest time_scale for them is 250000000.0"):
        trace_arrival_times(np.array([1.0, 5.0]), 3e8)
    assert trace_arrival_times(np.array([1.0, 5.0]), 2.5e8)[-1] == MAX_ARRIVAL_SPAN_S


def _azure(tmp_path: Path) -> str:
    path = tmp_path / "az.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,10,5\n2023-11-16 18:00:01.5,20,5\n"
        "2023-11-16 18:00:04.0,30,5\n"
    )
    return str(path)


def test_the_rule_rate_overrides_the_workloads_own_process(tmp_path: Path) -> None:
    plan = load_workload(_azure(tmp_path), time_scale=2.0).sample(3, seed=0)
    assert session_arrival_times(plan).tolist() == [0.0, 3.0, 8.0]  # own: trace x time_scale
    forced = session_arrival_times(plan, request_rate=1.5)
    assert forced[-1] == pytest.approx(2.0) and forced.tolist() != [0.0, 3.0, 8.0]
    assert not session_arrival_times(plan, request_rate=math.inf).any()

    mt = load_workload("multi-turn").sample(400, seed=0)  # spec: poisson at 0.5 sessions/s
    own = session_arrival_times(mt)
    assert len(own) == mt.num_sessions < 400
    assert own[-1] == pytest.approx(mt.num_sessions / 0.5)
    assert session_arrival_times(mt, request_rate=2.0)[-1] == pytest.approx(mt.num_sessions / 2)
    assert not session_arrival_times(load_workload("chat").sample(20)).any()  # none: inf
