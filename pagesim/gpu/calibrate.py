"""`pagesim calibrate`: measure step times over a grid of step shapes on the local GPU.

Every grid point is a synthetic `SchedulerOutput` executed by the real `GPUModelRunner`
(`execute_model`, the very call a served step makes: input preparation, the forward pass, the
LM head, the sampler and the sync), timed on the host clock around the call, which ends with a
device sync. Per point: one warm-up call (Triton compiles on first use), then `repeats` timed
calls; the profile keeps the median and the 10th/90th percentiles.

    decode   batch B x context C (cached tokens per sequence), one new token each
    prefill  one request: N new tokens over K cached tokens (chunked prefill with a prefix)
    mixed    one prefill chunk plus a decode batch (the chunked-prefill step)
    overhead host time per engine step outside execute_model (schedule + update), by batch

Attention vs the rest: the same step is timed again with every layer's attention replaced by
the identity (`GPUModelRunner.skip_attention`); that time is `other_ms` and
`attention_ms = step_time_ms - other_ms`. The non-attention part depends on the step's tokens
and sequences, not on contexts, so it is timed once per (block size, batch) at the smallest
context of the row and reused along the row.

Block ids of the synthetic sequences come from a seeded permutation of the whole cache (a
long-running server's tables are scattered, never contiguous), and a point whose K/V would not
fit in the measured KV cache is skipped: a server cannot run it either.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pagesim.cost.profile import DecodeRow, MixedRow, OverheadRow, PrefillRow
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput

Progress = Callable[[int, int, str], None]  # (done, total, label)


@dataclass(frozen=True)
class CalibrationGrid:
    """The shapes to measure. Points that exceed the model or the cache are dropped."""

    block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    decode_batches: tuple[int, ...] = (1, 4, 16, 32, 64, 128, 192, 256, 384, 512)
    decode_contexts: tuple[int, ...] = (128, 512, 1024, 2048, 4096, 8192)
    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    prefill_cached: tuple[int, ...] = (0, 1024, 4096)
    # (new tokens, cached tokens, decode batch, decode context)
    mixed: tuple[tuple[int, int, int, int], ...] = (
        (256, 0, 32, 512), (1024, 0, 32, 512), (256, 0, 128, 512), (1024, 0, 128, 512),
        (2048, 1024, 64, 1024))
    # Block sizes that get the full grid; the others get decode rows only (the block size
    # changes the attention kernels, which the decode rows measure; `other` is shared).
    full_block_sizes: tuple[int, ...] = (16, 32)
    overhead_max_reqs: int = 256
    repeats: int = 5
    min_repeats: int = 3
    target_point_s: float = 0.25  # fewer repeats for slow points, never under min_repeats

    def to_json(self) -> dict[str, list[int]]:
        return {"block_sizes": list(self.block_sizes),
                "decode_batches": list(self.decode_batches),
                "decode_contexts": list(self.decode_contexts),
                "prefill_tokens": list(self.prefill_tokens),
                "prefill_cached": list(self.prefill_cached),
                "full_block_sizes": list(self.full_block_sizes)}


@dataclass
class Timing:
    """Median and spread of repeated wall times, seconds."""

    median: float
    p10: float
    p90: float
    samples: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        a = np.asarray(samples)
        return cls(float(np.median(a)), float(np.percentile(a, 10)),
                   float(np.percentile(a, 90)), list(samples))


class BlockSource:
    """Hands out block ids from a seeded permutation of `1 .. num_blocks - 1`, restarting
    for every grid point (a point's sequences never share a block)."""

    def __init__(self, num_blocks: int, seed: int = 0) -> None:
        self.ids = (np.random.default_rng(seed).permutation(num_blocks - 1) + 1).tolist()

    def take(self, counts: list[int]) -> list[list[int]] | None:
        """Rows of `counts[i]` distinct blocks, or None if the cache cannot hold them all."""
        if sum(counts) > len(self.ids):
            return None
        rows, at = [], 0
        for c in counts:
            rows.append(self.ids[at:at + c])
            at += c
        return rows


def _request(rid: str, context: int, num_new: int, prompts: dict[int, list[int]]) -> Request:
    """A request whose step computes `num_new` tokens over `context` cached ones.

    Decode shape (num_new == 1, context > 0): prompt of `context` tokens plus one sampled
    token, as after its prefill. Otherwise: a prompt of `context + num_new` tokens. Prompt
    lists are shared through `prompts` (length -> tokens) so big batches build quickly.
    """
    decode = num_new == 1 and context > 0
    n = context if decode else context + num_new
    if n not in prompts:
        prompts[n] = [(j * 104_729 + 17) % 32_000 for j in range(n)]
    req = Request(rid, prompts[n], max_tokens=1 << 20)
    if decode:
        req.output_token_ids.append(7)
    return req


def synthetic_step(entries: list[tuple[int, int]], block_size: int,
                   blocks: BlockSource, step_id: int = 0) -> SchedulerOutput | None:
    """A step of `(context, num_new)` entries (decodes first, as a running batch), or None if
    its K/V does not fit in the cache."""
    counts = [-(-(c + n) // block_size) for c, n in entries]
    rows = blocks.take(counts)
    if rows is None:
        return None
    out = SchedulerOutput(step_id=step_id, block_size=block_size)
    prompts: dict[int, list[int]] = {}
    for k, ((ctx, new), row) in enumerate(zip(entries, rows)):
        req = _request(f"cal-{k}", ctx, new, prompts)
        out.scheduled.append(ScheduledRequest(req, new, ctx, row))
        out.total_num_scheduled_tokens += new
    return out


def time_step(runner, out: SchedulerOutput, grid: CalibrationGrid,
              skip_attention: bool = False) -> Timing:
    """Warm up twice, then time `execute_model(out)` on the host clock (it ends synced).

    Python's cyclic GC is paused while timing, as it is during a real run (`serve.replay`).
    """
    runner.skip_attention = skip_attention
    runner.record_steps = False
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        t = time.perf_counter()
        runner.execute_model(out)
        first = time.perf_counter() - t
        t = time.perf_counter()
        runner.execute_model(out)  # second warm-up: the first may have compiled kernels
        warm = time.perf_counter() - t
        n = max(grid.min_repeats, min(grid.repeats, math.ceil(grid.target_point_s /
                                                              max(warm, 1e-6))))
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            runner.execute_model(out)
            samples.append(time.perf_counter() - t)
        del first
        return Timing.of(samples)
    finally:
        runner.skip_attention = False
        runner.record_steps = True
        if gc_was_enabled:
            gc.enable()


def decode_points(grid: CalibrationGrid, max_model_len: int, capacity_tokens: int,
                  max_num_seqs: int) -> list[tuple[int, int]]:
    """(batch, context) pairs that a server could run: context + 1 <= max_model_len, every
    sequence's blocks fit, batch <= max_num_seqs. The longest context is capped to
    max_model_len - 1 so that the row ends at the model's limit."""
    contexts = sorted({min(c, max_model_len - 1) for c in grid.decode_contexts})
    return [(b, c) for b in grid.decode_batches for c in contexts
            if b <= max_num_seqs and b * (c + 1) <= capacity_tokens]


def prefill_points(grid: CalibrationGrid, max_model_len: int,
                   max_num_batched_tokens: int) -> list[tuple[int, int]]:
    return [(n, k) for n in grid.prefill_tokens for k in grid.prefill_cached
            if n <= max_num_batched_tokens and n + k <= max_model_len]


def calibrate_block_size(runner, block_size: int, grid: CalibrationGrid, *, max_model_len: int,
                         max_num_batched_tokens: int, max_num_seqs: int, full: bool,
                         progress: Progress | None = None, seed: int = 0,
                         deadline: float | None = None
                         ) -> tuple[list[DecodeRow], list[PrefillRow], list[MixedRow]]:
    """All rows of one block size (the runner's cache must use `block_size`)."""
    blocks = BlockSource(runner.num_gpu_blocks, seed)
    capacity = (runner.num_gpu_blocks - 1) * block_size
    dec = decode_points(grid, max_model_len, capacity, max_num_seqs)
    pre = prefill_points(grid, max_model_len, max_num_batched_tokens) if full else []
    mix = [m for m in grid.mixed if m[2] * (m[3] + 1) + m[0] + m[1] <= capacity
           and m[0] + m[1] <= max_model_len and m[0] + m[2] <= max_num_batched_tokens] \
        if full else []
    total = len(dec) + len(pre) + len(mix)
    done = 0

    def tick(label: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, f"bs={block_size} {label}")

    def late() -> bool:
        return deadline is not None and time.monotonic() > deadline

    decode_rows: list[DecodeRow] = []
    other_by_batch: dict[int, Timing] = {}
    for b, c in dec:
        if late():
            break
        out = synthetic_step([(c, 1)] * b, block_size, blocks)
        if out is None:  # its blocks do not fit (partial last blocks): a server cannot run it
            tick(f"decode b={b} c={c} skipped")
            continue
        if b not in other_by_batch:
            other_by_batch[b] = time_step(runner, out, grid, skip_attention=True)
        t = time_step(runner, out, grid)
        o = other_by_batch[b].median
        decode_rows.append(DecodeRow(block_size, b, c, *_ms(t), max(0.0, t.median - o) * 1e3,
                                     min(o, t.median) * 1e3))
        tick(f"decode b={b} c={c}")
    prefill_rows: list[PrefillRow] = []
    other_by_tokens: dict[int, Timing] = {}
    for n, k in pre:
        if late():
            break
        out = synthetic_step([(k, n)], block_size, blocks)
        if out is None:
            tick(f"prefill n={n} k={k} skipped")
            continue
        if n not in other_by_tokens:
            other_by_tokens[n] = time_step(runner, out, grid, skip_attention=True)
        t = time_step(runner, out, grid)
        o = other_by_tokens[n].median
        prefill_rows.append(PrefillRow(block_size, n, k, *_ms(t), max(0.0, t.median - o) * 1e3,
                                       min(o, t.median) * 1e3))
        tick(f"prefill n={n} k={k}")
    mixed_rows: list[MixedRow] = []
    for n, k, b, c in mix:
        if late():
            break
        out = synthetic_step([(c, 1)] * b + [(k, n)], block_size, blocks)
        if out is None:
            tick(f"mixed n={n} b={b} skipped")
            continue
        o = time_step(runner, out, grid, skip_attention=True).median
        t = time_step(runner, out, grid)
        mixed_rows.append(MixedRow(block_size, n, k, b, c, *_ms(t),
                                   max(0.0, t.median - o) * 1e3, min(o, t.median) * 1e3))
        tick(f"mixed n={n} b={b}")
    return decode_rows, prefill_rows, mixed_rows


def _ms(t: Timing) -> tuple[float, float, float]:
    return t.median * 1e3, t.p10 * 1e3, t.p90 * 1e3


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
