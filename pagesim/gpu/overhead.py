"""Host overhead per engine step, from a real replay: the calibration's overhead table.

The replay is a served step's host work on the host that serves: the shared `Scheduler`
and the `GPUModelRunner` in the serve loop (`pagesim.gpu.serve.replay`). Two things are
measured from it:

- host time per decode-only step, by batch size (`overhead_rows`): a ramp of requests that
  arrive together and finish one by one, so every batch size is visited;
- the extra host time of a step that admits prompts (`admission_overhead`): hashing their
  blocks, looking them up in the prefix cache, allocating and recording them. Requests join
  the decoding ramp in groups of 1, 2, 4 and 8, as requests join a served batch. The groups
  differ in size so that the cost per admitting step and the cost per admitted prompt can be
  told apart: with one prefill entry per admitting step only their sum would be measured.

The ramp's prompts are as long as the cache allows (`ramp_prompt_len`), so that its steps look
like served ones, whose host time short prompts understate.
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.cost.profile import OverheadRow
from pagesim.cost.surface import Pwl
from pagesim.cost.varlen_launch import nonnegative_lstsq
from pagesim.gpu.calibration_grid import median_p10_p90
from pagesim.request import Request

#: Requests that join the ramp (`overhead_requests`), the sizes of the groups they arrive in
#: (cycled), and the gap between groups.
NUM_JOINING = 45
JOIN_GROUP_SIZES = (1, 2, 4, 8)
JOIN_GAP_S = 0.15
JOIN_START_S = 0.5


def overhead_rows(steps, max_reqs: int = 256) -> list[OverheadRow]:
    """Host overhead per decode-only step by batch size, from the steps of a real run.

    `steps` are `ServeStep`s; steps with prefill entries are left out (their extra is
    `admission_overhead`'s). Each power of two g up to `max_reqs` takes the steps with num_reqs
    in [g / sqrt(2), g * sqrt(2)) and keeps the median and 10th/90th percentiles of their host
    time outside execute_model. Grid values with fewer than 3 steps are left out.
    """
    grid_reqs = tuple(2**i for i in range(int(math.log2(max_reqs)) + 1))
    by_n: dict[int, list[float]] = {}
    for s in steps:
        if not s.num_prefill_reqs:
            by_n.setdefault(s.num_reqs, []).append(s.host_overhead_s)
    rows = []
    for g in grid_reqs:
        lo, hi = g / math.sqrt(2), g * math.sqrt(2)
        vals = [v for n, vs in by_n.items() if lo <= n < hi for v in vs]
        if len(vals) >= 3:
            rows.append(OverheadRow(g, *median_p10_p90(np.asarray(vals) * 1e3)))
    return rows


def admission_overhead(steps, rows: list[OverheadRow]) -> tuple[float, float] | None:
    """(ms per step, ms per prefill entry) that steps with prefill entries spend on the host
    beyond the decode-only table `rows` at their batch size; None with fewer than 3 such
    steps or no table.

    The fit is a line through the median excess of each entry count, weighted by the square
    root of its number of steps, with both terms >= 0. Medians, because one step held up by
    the host (a collection, a page fault) is several times a typical excess, and a least
    squares line over single steps turns it into a slope. The table is read as the cost model
    reads it (`Pwl` over the batch size)."""
    if not rows:
        return None
    table = Pwl({r.num_reqs: [r.overhead_ms] for r in rows})
    by_entries: dict[int, list[float]] = {}
    for s in steps:
        if s.num_prefill_reqs:
            excess = s.host_overhead_s * 1e3 - table(s.num_reqs)
            by_entries.setdefault(s.num_prefill_reqs, []).append(excess)
    if sum(map(len, by_entries.values())) < 3:
        return None
    counts = sorted(by_entries)
    entries = np.array(counts, dtype=float)
    median = np.array([np.median(by_entries[k]) for k in counts])
    if len(counts) == 1:  # one entry count: no slope to find, all of it per step
        return max(float(median[0]), 0.0), 0.0
    weight = np.sqrt([len(by_entries[k]) for k in counts])
    base, per_entry = nonnegative_lstsq([weight, weight * entries], weight * median)
    return base, per_entry


def overhead_requests(
    max_reqs: int, prompt_len: int = 64, vocab: int = 32000, num_joining: int = 0
) -> list[Request]:
    """`max_reqs` requests arriving together with output lengths 1 .. 2 * max_reqs (step 2):
    they all decode, then finish one by one, so the run visits every batch size once. With
    `num_joining`, that many more join the decoding batch in groups of `JOIN_GROUP_SIZES`
    (group g arrives at `JOIN_START_S` + g * `JOIN_GAP_S`; the last group may be smaller),
    with the same prompt length and 8 output tokens.
    Prompt tokens are distinct per request (no prefix hits)."""
    joins = join_times(num_joining)
    reqs = []
    for i in range(max_reqs + num_joining):
        prompt = [(i * 7919 + j * 104729) % vocab for j in range(prompt_len)]
        if i < max_reqs:
            reqs.append(Request(f"oh-{i}", prompt, max_tokens=2 * (i + 1), arrival_time=0.0))
        else:
            k = i - max_reqs
            reqs.append(Request(f"oh-join-{k}", prompt, max_tokens=8, arrival_time=joins[k]))
    return reqs


def join_times(num_joining: int) -> list[float]:
    """Arrival time of each joining request: groups of `JOIN_GROUP_SIZES`, cycled."""
    times: list[float] = []
    group = 0
    while len(times) < num_joining:
        size = JOIN_GROUP_SIZES[group % len(JOIN_GROUP_SIZES)]
        times += [JOIN_START_S + group * JOIN_GAP_S] * min(size, num_joining - len(times))
        group += 1
    return times


def ramp_prompt_len(
    max_reqs: int, capacity_tokens: int, longest: int = 1024, shortest: int = 64
) -> int:
    """The ramp's prompt length: as long as `longest` while the ramp's K/V (every prompt plus
    its mean output, `max_reqs` tokens) fits 80 % of the cache, never below `shortest`."""
    fit = int(0.8 * capacity_tokens) // max_reqs - max_reqs
    return max(shortest, min(longest, fit))
