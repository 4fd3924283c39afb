"""Correction `multi_part`: the fixed cost that a step of several parts pays once.

Every part's residual (a decode group's, each prefill entry's) was measured alone and carries
the attention launches, which a step of several parts pays once; summing residuals prices that
cost too often. `shared`, what one more part adds less than its residual says, is the median
over the rows with several parts (mixed.csv, multi_prefill.csv) of (sum of parts - measured) /
(parts - 1), clamped to [0, smallest residual]; with mixed graphs once per mode; without such
rows, the smallest residual. A step priced by `varlen` does not use it. Off: 0 (the parts add
up). Switched off, the shipped profiles' held-out MAPE moves 0.00 points: `varlen` prices their
steps of several parts (docs/cost_model.md).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from pagesim.cost.profile_rows import multi_part_shape


def fit_shared(model, rows: list[tuple[str, int, Any]], floor: float) -> dict[bool, float]:
    """Graph mode (True: a mixed graph) -> seconds that one part more than one takes off the
    sum of the residuals; `model._parts` must not subtract any yet, `floor` is the smallest
    residual."""
    excess: dict[bool, list[float]] = {True: [], False: []}
    for kind, tokens, r in rows:
        shape = multi_part_shape(kind, r)
        if shape is not None:
            parts = len(shape.prefill_new_tokens) + (shape.num_decode_seqs > 0)
            total = model._parts(shape)[0]
            excess[model._is_graph_row(r, tokens)].append(
                (total - model._measured_s(r)) / (parts - 1)
            )
    every = excess[True] + excess[False]
    shared = {}
    for mode in (True, False):
        fit = excess[mode] if (excess[mode] and model._token_sizes) else every
        shared[mode] = min(max(median(fit), 0.0), floor) if fit else floor
    return shared
