"""Summary statistics of samples stored as runs (value, count), equal to numpy's on the
expanded samples, float for float.

The pooled ITL of a run holds one gap per output token (tens of millions at 100k requests),
but a step of n lazy decodes adds n equal gaps, so the collector keeps it as runs: the gap
`values[i]` repeated `counts[i]` times, in order. `run_stats` gives what `_stats` of
`pagesim.metrics.report` gives for the expanded array:

    mean, std   numpy's pairwise sums need the samples in order: the runs are expanded once
                (milliseconds), and the std's squares are taken in that buffer, not a second one
    median, pN  order statistics: read from the runs sorted by value (no partition of the
                expanded array), then combined with numpy's own formulas (`np.median`'s mean of
                the middle pair, `np.percentile`'s linear interpolation)

`tests/sim/test_metric_runs.py` holds every value to numpy's on the expanded array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np


def expand(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The samples in order: `values[i]` repeated `counts[i]` times (float64)."""
    return np.repeat(values, counts)


def run_stats(name: str, values_s: np.ndarray, counts: np.ndarray,
              percentiles: Iterable[float]) -> dict[str, float]:
    """`_stats(name, expand(values_s, counts), percentiles)` of `pagesim.metrics.report`: mean,
    median, std and percentiles in ms of the samples (seconds) given as runs; counts >= 0."""
    run_ms = values_s * 1000.0  # the expanded samples' `* 1000.0`, once per run
    n = int(counts.sum())
    if n == 0:  # `_stats` of no samples: one zero
        run_ms, counts, n = np.zeros(1), np.ones(1, dtype=np.int64), 1
    ms = expand(run_ms, counts)
    mean = float(np.mean(ms))
    std = _std_consuming(ms)
    del ms
    kth = _order_statistics(run_ms, counts)
    out = {f"mean_{name}_ms": mean, f"median_{name}_ms": _median(kth, n),
           f"std_{name}_ms": std}
    for p in percentiles:
        key = f"p{int(p)}" if float(p).is_integer() else f"p{p}"
        out[f"{key}_{name}_ms"] = _percentile_linear(kth, n, p)
    return out


def _std_consuming(x: np.ndarray) -> float:
    """`float(np.std(x))` (numpy's `_var` step for step), its squared deviations written over
    `x` instead of into a new array of the same size."""
    n = np.intp(x.size)
    mean = np.add.reduce(x, keepdims=True)
    np.true_divide(mean, n, out=mean, casting="unsafe")
    np.subtract(x, mean, out=x)
    np.square(x, out=x)
    total = np.add.reduce(x)
    var = total.dtype.type(total / n)
    return float(np.sqrt(var))


def _order_statistics(values: np.ndarray, counts: np.ndarray) -> Callable[[int], np.float64]:
    """k -> the k-th smallest (0-based) of the expanded samples."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    ends = np.cumsum(counts[order])  # samples up to and including each sorted run

    def kth(k: int) -> np.float64:
        return sorted_values[int(np.searchsorted(ends, k, side="right"))]
    return kth


def _median(kth: Callable[[int], np.float64], n: int) -> float:
    """`np.median` of the n samples: the mean of the middle one or two, as numpy takes it."""
    if n % 2 == 0:
        middle = np.array([kth(n // 2 - 1), kth(n // 2)], dtype=np.float64)
    else:
        middle = np.array([kth((n - 1) // 2)], dtype=np.float64)
    return float(np.mean(middle))


def _percentile_linear(kth: Callable[[int], np.float64], n: int, p: float) -> float:
    """`np.percentile(samples, p)` (method "linear"), numpy's steps: virtual index (n-1)q,
    its floor and the next index (clipped to the last sample), then `_lerp`."""
    q = np.true_divide(p, 100, out=...)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    if virtual >= n - 1:
        a = b = kth(n - 1)
    elif virtual < 0:
        a = b = kth(0)
    else:
        a, b = kth(int(previous)), kth(int(previous) + 1)
    gamma = np.asanyarray(virtual - previous, dtype=virtual.dtype)
    if type(p) in (int, float):  # numpy's weak promotion of a Python scalar q
        gamma = float(gamma)
    diff = b - a
    result = a + diff * gamma
    if gamma >= 0.5:
        result = b - diff * (1 - gamma)
    return float(result)
