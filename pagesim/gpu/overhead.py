"""Host overhead per engine step, from a real replay: the calibration's overhead table.

The replay is a served step's host work on the host that serves: the shared `Scheduler`
and the `GPUModelRunner` in the serve loop (`pagesim.gpu.serve.replay`). Two things are
measured from it:

- host time per decode-only step, by batch size (`overhead_rows`): a ramp of requests that
  arrive together and finish one by one, so every batch size is visited;
- the extra host time of a step that admits prompts (`admission_overhead`): hashing their
  blocks, looking them up in the prefix cache, allocating and recording them. A few requests
  arrive one at a time while the ramp decodes, as requests join a served batch.

The ramp's prompts are as long as the cache allows (`ramp_prompt_len`), so that its steps
look like served ones: with 64-token prompts, served decode steps of the same batch took up
to twice as long on the host as the ramp's on the H200
(`results/validation/host_overhead_<model>.md`).
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.cost.profile import OverheadRow
from pagesim.cost.surface import Pwl
from pagesim.cost.varlen import nonnegative_lstsq
from pagesim.request import Request

#: Requests that arrive one at a time during the ramp (`overhead_requests`), and their gap.
NUM_JOINING = 24
JOIN_GAP_S = 0.15
JOIN_START_S = 0.5


def overhead_rows(steps, grid_reqs: tuple[int, ...] | None = None,
                  max_reqs: int = 256) -> list[OverheadRow]:
    """Host overhead per decode-only step by batch size, from the steps of a real run.

    `steps` are `ServeStep`s; steps with prefill entries are left out (their extra is
    `admission_overhead`'s). Each grid value g takes the steps with num_reqs in
    [g / sqrt(2), g * sqrt(2)) and keeps the median and 10th/90th percentiles of their host
    time outside execute_model. Grid values with fewer than 3 steps are left out.
    """
    grid_reqs = grid_reqs or tuple(2 ** i for i in range(int(math.log2(max_reqs)) + 1))
    by_n: dict[int, list[float]] = {}
    for s in steps:
        if not s.num_prefill_reqs:
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


def admission_overhead(steps, rows: list[OverheadRow]) -> tuple[float, float] | None:
    """(ms per step, ms per prefill entry) that steps with prefill entries spend on the host
    beyond the decode-only table `rows` at their batch size: least squares with both >= 0
    over those steps; None with fewer than 3 such steps or no table.

    The table is read as the cost model reads it (`Pwl` over the batch size)."""
    if not rows:
        return None
    table = Pwl({r.num_reqs: [r.overhead_ms] for r in rows})
    pts = [(s.num_prefill_reqs, s.host_overhead_s * 1e3 - table(s.num_reqs))
           for s in steps if s.num_prefill_reqs]
    if len(pts) < 3:
        return None
    entries = np.array([p[0] for p in pts], dtype=float)
    excess = np.array([p[1] for p in pts])
    if np.ptp(entries) == 0:  # one entry count: no slope to find, all of it per step
        return max(float(np.median(excess)), 0.0), 0.0
    base, per_entry = nonnegative_lstsq([np.ones_like(entries), entries], excess)
    return base, per_entry


def overhead_requests(max_reqs: int, prompt_len: int = 64, block_size: int = 16,
                      vocab: int = 32000, num_joining: int = 0) -> list[Request]:
    """`max_reqs` requests arriving together with output lengths 1 .. 2 * max_reqs (step 2):
    they all decode, then finish one by one, so the run visits every batch size once. With
    `num_joining`, that many more arrive one at a time (`JOIN_START_S` + k * `JOIN_GAP_S`)
    and join the decoding batch, with the same prompt length and 8 output tokens.
    Prompt tokens are distinct per request (no prefix hits)."""
    reqs = []
    for i in range(max_reqs + num_joining):
        prompt = [(i * 7919 + j * 104729) % vocab for j in range(prompt_len)]
        if i < max_reqs:
            reqs.append(Request(f"oh-{i}", prompt, max_tokens=2 * (i + 1), arrival_time=0.0))
        else:
            k = i - max_reqs
            reqs.append(Request(f"oh-join-{k}", prompt, max_tokens=8,
                                arrival_time=JOIN_START_S + k * JOIN_GAP_S))
    return reqs


def ramp_prompt_len(max_reqs: int, capacity_tokens: int, longest: int = 1024,
                    shortest: int = 64) -> int:
    """The ramp's prompt length: as long as `longest` while the ramp's K/V (every prompt plus
    its mean output, `max_reqs` tokens) fits 80 % of the cache, never below `shortest`."""
    fit = int(0.8 * capacity_tokens) // max_reqs - max_reqs
    return max(shortest, min(longest, fit))
