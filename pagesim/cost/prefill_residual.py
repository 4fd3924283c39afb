"""What the variable-length fit misses on the calibration's own single long prefills.

The variable-length kernel's fit (`pagesim.cost.varlen`) is one model for every row with
prefill entries (prefill, mixed and multi-prefill rows) and prices each step from its kernel
work. It does not pass through the rows: on the H200 it prices llama-3-8b's eager prefill
rows of 2,048-8,192 new tokens 3-8 % above their own measured time in every calibration
(llama-2-7b's 0-4 %), while the rows with several entries, and the served rate-inf steps
made of them, are priced within their noise.

A served step with one prompt's prefill and no mixed graph (a long prompt arriving at 50-95 %
load, beside the running decodes) has the shape of such a row, so it takes that row's
residual: measured minus priced, in seconds. The residual is piecewise linear in
log2(new tokens) along each cached-prefix level the grid measured and linear between levels,
held flat outside the grid; block sizes without rows blend the measured ones as every other
table does. Steps with several prefill entries, and steps that run a mixed graph, keep the fit
alone.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict

from pagesim.cost.surface import Pwl


class PrefillResidual:
    """Seconds to add to a one-prefill eager step of (new tokens, cached tokens)."""

    __slots__ = ("levels", "lines")

    def __init__(self, points: list[tuple[int, int, float]]) -> None:
        """`points`: (new tokens, cached tokens, measured - priced seconds), repeats allowed
        (their median is kept)."""
        by_level: dict[int, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for new, cached, residual in points:
            by_level[cached][math.log2(new)].append(residual)
        self.levels = sorted(by_level)
        self.lines = [Pwl(by_level[c], extrapolate=False) for c in self.levels]

    def __call__(self, new: int, cached: int) -> float:
        x = math.log2(max(new, 1))
        levels, lines = self.levels, self.lines
        if cached <= levels[0]:
            return lines[0](x)
        i = bisect_right(levels, cached) - 1
        if i >= len(levels) - 1:
            return lines[-1](x)
        w = (cached - levels[i]) / (levels[i + 1] - levels[i])
        return (1.0 - w) * lines[i](x) + w * lines[i + 1](x)
