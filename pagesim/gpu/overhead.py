"""Host overhead per engine step, from a real replay: the calibration's overhead table."""

from __future__ import annotations

import math

import numpy as np

from pagesim.cost.profile import OverheadRow
from pagesim.request import Request


def overhead_rows(steps, grid_reqs: tuple[int, ...] | None = None,
                  max_reqs: int = 256) -> list[OverheadRow]:
    """Host overhead per step by batch size, from the steps of a real (serve) run.

    `steps` are `ServeStep`s; each grid value g takes the steps with num_reqs in
    [g / sqrt(2), g * sqrt(2)) and keeps the median and 10th/90th percentiles of their host
    time outside execute_model. Grid values with no step are left out.
    """
    grid_reqs = grid_reqs or tuple(2 ** i for i in range(int(math.log2(max_reqs)) + 1))
    by_n: dict[int, list[float]] = {}
    for s in steps:
        by_n.setdefault(s.num_reqs, []).append(s.host_overhead_s)
    rows = []
    for g in grid_reqs:
        lo, hi = g / math.sqrt(2), g * math.sqrt(2)
        vals = [v for n, vs in by_n.items() if lo <= n < hi for v in vs]
        if len(vals) >= 3:
            a = np.asarray(vals) * 1e3
            rows.append(OverheadRow(g, float(np.median(a)), float(np.percentile(a, 10)),
                                    float(np.percentile(a, 90))))
    return rows


def overhead_requests(max_reqs: int, prompt_len: int = 64, block_size: int = 16,
                      vocab: int = 32000) -> list[Request]:
    """`max_reqs` requests arriving together with output lengths 1 .. 2 * max_reqs (step 2):
    they all decode, then finish one by one, so the run visits every batch size once."""
    reqs = []
    for i in range(max_reqs):
        prompt = [(i * 7919 + j * 104729) % vocab for j in range(prompt_len)]
        reqs.append(Request(f"oh-{i}", prompt, max_tokens=2 * (i + 1), arrival_time=0.0))
    return reqs
