"""Summary statistics of samples stored as runs (value, count), equal to numpy's on the
expanded samples, float for float.

The pooled ITL of a run holds one gap per output token (tens of millions at 100k requests),
but a step of n bulk decodes adds n equal gaps, so the collector keeps it as runs: the gap
`values[i]` repeated `counts[i]` times, in order. `run_stats` gives
what `_stats` of `pagesim.metrics.report` gives for the expanded array:

    mean, std   numpy's pairwise sums (`np.add.reduce` splits the array in halves rounded to
                multiples of 8, down to blocks of 128): the same split is made here over the
                runs, down to parts of at most `leaf` samples, and each part is expanded and
                summed by numpy (the std's squared deviations as numpy's `_var` takes them), so
                the whole array is never built
    median, pN  order statistics: read from the runs sorted by value (no partition of the
                expanded array), then combined with numpy's own formulas (`np.median`'s mean of
                the middle pair, `np.percentile`'s linear interpolation)

`tests/sim/test_metric_runs.py` holds every value to numpy's on the expanded array.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import numpy as np

LEAF_SAMPLES = 1 << 20  # samples expanded at a time (8 MB of float64)


def expand(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The samples in order: `values[i]` repeated `counts[i]` times (float64)."""
    return np.repeat(values, counts)


def run_stats(
    name: str,
    values_s: np.ndarray,
    counts: np.ndarray,
    percentiles: Iterable[float],
    *,
    leaf: int = LEAF_SAMPLES,
) -> dict[str, float]:
    """`_stats(name, expand(values_s, counts), percentiles)` of `pagesim.metrics.report`: mean,
    median, std and percentiles in ms of the samples (seconds) given as runs; counts >= 0.
    At most `leaf` samples are expanded at a time."""
    keep = counts > 0
    run_ms = values_s[keep] * 1000.0  # the expanded samples' `* 1000.0`, once per run
    counts = counts[keep]
    n = int(counts.sum())
    if n == 0:  # `_stats` of no samples: one zero
        run_ms, counts, n = np.zeros(1), np.ones(1, dtype=np.int64), 1
    chunk = _Chunks(run_ms, counts)
    mean = _pairwise_sum(n, chunk.sum, leaf) / n  # np.mean: the sum over the count
    std = float(np.sqrt(_pairwise_sum(n, partial(chunk.squared_deviation_sum, mean), leaf) / n))
    kth = _order_statistics(run_ms, counts)
    out = {
        f"mean_{name}_ms": float(mean),
        f"median_{name}_ms": _median(kth, n),
        f"std_{name}_ms": std,
    }
    for p in percentiles:
        key = f"p{int(p)}" if float(p).is_integer() else f"p{p}"
        out[f"{key}_{name}_ms"] = _percentile_linear(kth, n, p)
    return out


def _pairwise_sum(n: int, leaf_sum: Callable[[int, int], np.float64], leaf: int) -> np.float64:
    """numpy's float64 sum of n samples (`np.add.reduce`: its `pairwise_sum` over the whole
    array), split as that function splits, each part of at most `leaf` samples summed by numpy
    itself (`leaf_sum(lo, hi)` over samples lo..hi-1): the same float."""

    def rec(lo: int, size: int) -> np.float64:
        if size <= leaf:
            return leaf_sum(lo, lo + size)
        half = size // 2
        half -= half % 8  # pairwise_sum: halves, rounded down to the unroll factor 8
        return rec(lo, half) + rec(lo + half, size - half)

    return rec(0, n)


class _Chunks:
    """Expanded samples lo..hi-1 of runs (every count >= 1), for `_pairwise_sum`'s parts."""

    __slots__ = ("values", "counts", "starts", "ends")

    def __init__(self, values: np.ndarray, counts: np.ndarray) -> None:
        self.values, self.counts = values, counts
        self.ends = np.cumsum(counts)
        self.starts = self.ends - counts

    def samples(self, lo: int, hi: int) -> np.ndarray:
        i = int(np.searchsorted(self.ends, lo, side="right"))  # the run holding sample lo
        j = int(np.searchsorted(self.starts, hi, side="left"))  # one past the run of hi - 1
        counts = self.counts[i:j].copy()
        counts[0] -= lo - self.starts[i]
        counts[-1] -= self.ends[j - 1] - hi
        return np.repeat(self.values[i:j], counts)

    def sum(self, lo: int, hi: int) -> np.float64:
        return np.add.reduce(self.samples(lo, hi))

    def squared_deviation_sum(self, mean: np.float64, lo: int, hi: int) -> np.float64:
        """numpy's `_var` on the part: (x - mean) squared in place, then summed."""
        x = self.samples(lo, hi)
        np.subtract(x, mean, out=x)
        np.square(x, out=x)
        return np.add.reduce(x)


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
