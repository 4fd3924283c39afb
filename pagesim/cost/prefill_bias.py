"""What the variable-length fit gets wrong on one long prefill: a ratio per block size.

The variable-length kernel's fit (`pagesim.cost.varlen`) is one model for every row with
prefill entries (prefill, mixed and multi-prefill rows); it prices a step from its kernel
work and does not pass through the rows. On the H200 it prices most of llama-3-8b's eager
single-prefill rows of 2,048-8,192 new tokens 3-8 % above their measured time in every
calibration (llama-2-7b's up to 4 %), while the rows with several entries, and the served
rate-inf steps made of them, are priced within their noise.

A served step with one prompt's prefill that runs eagerly (a long prompt arriving at 50-95 %
load, beside the running decodes) has the shape of the eager rows with one prefill entry
(prefill rows, and mixed rows too long for a mixed graph), so it takes their bias: the
median over the block size's such rows of measured / priced, as a factor on the step. One
median and not each row's own residual: a row is one noisy measurement, and interpolating
prefill rows' residuals row by row priced held-out prefill rows worse than the fit alone
(llama-3-8b's MAPE over six hold-out draws 3.4 -> 3.9 %; with the median, 3.2 %). Steps
with several prefill entries, and steps that run a mixed graph, keep the fit alone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from statistics import median

from pagesim.cost.base import BatchShape
from pagesim.cost.profile_rows import row_batch


def single_prefill_bias(rows: Iterable[tuple[str, int, object]],
                        eager: Callable[[int], bool],
                        measured_s: Callable[[object], float],
                        priced_s: Callable[[BatchShape], float]) -> dict[int, float]:
    """Block size -> median of measured / priced - 1 over its eager rows with one prefill
    entry (prefill rows, one-entry multi-prefill rows, mixed rows); `rows` as `row_shapes`
    gives them, `eager(tokens)` says whether a step of that many tokens runs without a mixed
    graph."""
    ratios: dict[int, list[float]] = defaultdict(list)
    for kind, tokens, r in rows:
        shape = row_batch(kind, r)
        if shape is None or len(shape.prefill_new_tokens) != 1 or not eager(tokens):
            continue
        priced = priced_s(shape)
        if priced > 0.0:
            ratios[r.block_size].append(measured_s(r) / priced - 1.0)
    return {bs: median(v) for bs, v in sorted(ratios.items())}
