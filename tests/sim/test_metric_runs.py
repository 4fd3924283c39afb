"""`pagesim.metrics.runs`: statistics of run-length samples equal numpy's on the expanded
samples, float for float (the summary's ITL keys depend on it)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.metrics.collector import MetricsCollector
from pagesim.metrics.report import _stats
from pagesim.metrics.runs import expand, run_stats

PERCENTILES = (1, 25, 50, 90, 99, 99.9, 12.5, 66.6)

gaps = st.one_of(
    st.floats(0.0, 0.2, allow_nan=False, allow_subnormal=False),
    st.sampled_from([0.0, 0.0105, 0.0211, 0.03, 1e-9]),
)  # repeats: ties between runs
runs = st.lists(st.tuples(gaps, st.integers(0, 40)), min_size=0, max_size=40)


def _check(values: np.ndarray, counts: np.ndarray, leaf: int = 1 << 20) -> None:
    expected = _stats("itl", expand(values, counts), PERCENTILES)
    got = run_stats("itl", values, counts, PERCENTILES, leaf=leaf)
    assert list(got) == list(expected)  # same keys, same order
    for key, value in expected.items():
        assert got[key].hex() == value.hex(), key


@settings(max_examples=150, deadline=None)
@given(runs, st.sampled_from([128, 136, 200, 1 << 20]))
def test_run_stats_equal_numpy_on_expanded(pairs, leaf) -> None:
    """Small leaves: numpy's pairwise split is replayed over the runs (parts cut mid-run)."""
    values = np.array([v for v, _ in pairs], dtype=np.float64)
    counts = np.array([c for _, c in pairs], dtype=np.int64)
    _check(values, counts, leaf)


def test_run_stats_large_and_numpy_percentile_types() -> None:
    """Long runs (numpy's pairwise sums split many times) and a numpy-float percentile."""
    rng = np.random.default_rng(7)
    values = np.round(rng.random(3000) * 0.05, 6)
    counts = rng.integers(1, 300, size=3000)
    counts[::7] = 0
    for leaf in (1000, 4096, 1 << 20):  # about 450k samples: parts of numpy's tree, and none
        _check(values, counts, leaf)
    expanded = expand(values, counts)
    for p in (np.float64(99.0), 50, 99.5):
        got = run_stats("x", values, counts, (p,))
        key = next(k for k in got if k.startswith("p"))
        assert got[key] == float(np.percentile(expanded * 1000.0, p))


def test_collector_runs_expand_in_order() -> None:
    m = MetricsCollector()
    m.on_gaps(0.5, 3)
    m.on_gaps(0.25, 1)
    assert list(m.itl_s) == [0.5, 0.5, 0.5, 0.25]
    assert list(MetricsCollector().itl_s) == []
