"""Interpolation over measured step times: piecewise-linear lines and residual surfaces.

`Pwl` is a line through measured points (flat below the first, linear between, a floored
slope above the last). `Surface` is z(u, v) = backbone + deviation: a non-negative least-squares
fit on the terms a kernel's work is made of, plus the measured residual of that fit,
interpolated within the grid and held flat outside it. The backbone is linear in each work
term, so it extrapolates the way the hardware does and holds a ragged grid together (large
batches at long contexts may not fit and be absent); the deviation carries occupancy effects at
small shapes that no line can, and must not be extrapolated. `blend_weights` picks the
measured block sizes for another one.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict
from statistics import median
from typing import TypeVar

import numpy as np

from pagesim.cost.varlen_launch import nonnegative_lstsq

T = TypeVar("T")


class Pwl:
    """y(x) through sorted points (median of repeats): flat below the first point, linear
    between, and above the last either flat or along the last segment's slope floored at 0."""

    __slots__ = ("xs", "ys", "slopes", "tail")

    def __init__(self, points: dict[float, list[float]], extrapolate: bool = True):
        self.xs = sorted(points)
        self.ys = [median(points[x]) for x in self.xs]
        self.slopes = [
            (self.ys[i + 1] - self.ys[i]) / (self.xs[i + 1] - self.xs[i])
            for i in range(len(self.xs) - 1)
        ]
        self.tail = max(self.slopes[-1], 0.0) if self.slopes and extrapolate else 0.0

    def __call__(self, x: float) -> float:
        xs = self.xs
        if x <= xs[0]:
            return self.ys[0]
        i = bisect_right(xs, x) - 1
        if i >= len(xs) - 1:
            return self.ys[-1] + self.tail * (x - xs[-1])
        return self.ys[i] + self.slopes[i] * (x - xs[i])


class Surface:
    """z(u, v) = backbone(u, v) + deviation(u, v); see the module docstring.

    `points`: (u, v, z) triples, u and v >= 0. `prefill=False` uses the decode terms.
    """

    __slots__ = ("coef", "prefill", "us", "rows", "values")

    def __init__(self, points: list[tuple[int, int, float]], prefill: bool):
        self.prefill = prefill
        u = np.array([p[0] for p in points], dtype=float)
        v = np.array([p[1] for p in points], dtype=float)
        z = np.array([p[2] for p in points], dtype=float)
        self.coef = nonnegative_lstsq(self._terms(u, v), z)
        deviation: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for pu, pv, pz in points:
            deviation[pu][pv].append(pz - self._backbone(pu, pv))
        self.us = sorted(deviation)
        self.rows = [Pwl(deviation[x], extrapolate=False) for x in self.us]
        self.values = [p[2] for p in points]

    def _terms(self, u, v):  # works on floats and on numpy arrays
        one = u * 0 + 1
        if self.prefill:
            return [one, u, v, u * v, u * u]
        return [one, u, v, u * v]

    def _backbone(self, u: float, v: float) -> float:
        c = self.coef
        if self.prefill:
            return c[0] + u * (c[1] + c[3] * v + c[4] * u) + c[2] * v
        return c[0] + c[1] * u + (c[2] + c[3] * u) * v

    def __call__(self, u: float, v: float) -> float:
        us, rows = self.us, self.rows
        if u <= us[0]:
            dev = rows[0](v)
        else:
            i = bisect_right(us, u) - 1
            if i >= len(us) - 1:
                dev = rows[-1](v)
            else:
                d0 = rows[i](v)
                dev = d0 + (rows[i + 1](v) - d0) * (u - us[i]) / (us[i + 1] - us[i])
        return self._backbone(u, v) + dev


def blend_weights(tables: dict[int, T], block_size: int) -> tuple[tuple[float, T], ...]:
    """Measured block sizes to use for `block_size`, with weights summing to 1."""
    keys = sorted(tables)
    if block_size in tables or not keys[0] < block_size < keys[-1]:  # measured, or the nearest
        return ((1.0, tables[min(max(block_size, keys[0]), keys[-1])]),)
    hi = keys[bisect_right(keys, block_size)]
    lo = keys[bisect_right(keys, block_size) - 1]
    w = (math.log2(block_size) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
    return ((1.0 - w, tables[lo]), (w, tables[hi]))
