"""Correction `prefill_bias`: what the `varlen` fit leaves on one long prefill run eagerly.

The variable-length fit is one model for every row with prefill entries and does not pass
through the rows; it prices long eager single prefills a few % slow, the more the longer, while
steps of several entries are priced within their noise. A served step with one prompt's prefill
that runs eagerly (a long prompt arriving beside the running decodes) has the shape of the
eager rows with one prefill entry, so it takes their bias as a factor on the step: measured /
priced - 1 = a + b * log2(new tokens / 1,024), least squares over the block size's such rows,
held flat outside their range of tokens (a line, not each row's own residual: a row is one
noisy measurement). Fitted last, on the finished model. Off: the fit alone. Switched off, the
shipped profiles' held-out MAPE moves -0.01 to +0.08 points, within noise; on its fit rows the
`varlen` fit alone prices long eager prefills 3-8 % slow (docs/cost_model.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagesim.cost.base import BatchShape
from pagesim.cost.profile_rows import row_batch


@dataclass(frozen=True)
class PrefillBias:
    """measured / priced - 1 = intercept + slope * x, x = log2(new tokens / 1,024) held
    within [x_min, x_max] (the rows' range)."""

    intercept: float
    slope: float
    x_min: float
    x_max: float

    @classmethod
    def fit(cls, points: list[tuple[int, float]]) -> PrefillBias:
        """Least squares over (new tokens, ratio - 1) points; one distinct token count gives a
        flat line at their mean."""
        x = np.array([math.log2(n / 1024) for n, _ in points])
        y = np.array([r for _, r in points])
        if np.ptp(x) == 0.0:
            return cls(float(y.mean()), 0.0, float(x[0]), float(x[0]))
        slope, intercept = np.polyfit(x, y, 1)
        return cls(float(intercept), float(slope), float(x.min()), float(x.max()))

    def __call__(self, new_tokens: int) -> float:
        x = min(max(math.log2(max(new_tokens, 1) / 1024), self.x_min), self.x_max)
        return self.intercept + self.slope * x


def single_prefill_bias(
    rows: Iterable[tuple[str, int, Any]],
    eager: Callable[[int], bool],
    measured_s: Callable[[object], float],
    priced_s: Callable[[BatchShape], float],
) -> dict[int, PrefillBias]:
    """Block size -> `PrefillBias` over its eager rows with one prefill entry (prefill rows,
    one-entry multi-prefill rows, mixed rows); `rows` as `row_shapes` gives them,
    `eager(tokens)` says whether a step of that many tokens runs without a mixed graph."""
    points: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for kind, tokens, r in rows:
        shape = row_batch(kind, r)
        if shape is None or len(shape.prefill_new_tokens) != 1 or not eager(tokens):
            continue
        priced = priced_s(shape)
        if priced > 0.0:
            points[r.block_size].append((shape.prefill_new_tokens[0], measured_s(r) / priced - 1.0))
    return {bs: PrefillBias.fit(p) for bs, p in sorted(points.items())}
