"""`pagesim calibrate`: measure step times over a grid of step shapes on the local GPU.

Every grid point is a synthetic `SchedulerOutput` executed by the real `GPUModelRunner`
(`execute_model`, the very call a served step makes: input preparation, the forward pass, the
LM head, the sampler and the sync), timed on the host clock around the call, which ends with a
device sync. Per point: two warm-up calls (Triton compiles on first use), then one timed call
per round; the profile keeps the median and the 10th/90th percentiles over the rounds.

    decode   batch B x context C (cached tokens per sequence), one new token each
    prefill  one request: N new tokens over K cached tokens (chunked prefill with a prefix)
    mixed    one prefill chunk plus a decode batch (the chunked-prefill step)
    multi    k alike prefill entries in one step (a burst of arrivals sharing a prefix)
    shared   decode batch B x context C whose first S tokens are the same blocks for every
             sequence (a cached system prompt): the decode kernel reads those blocks B times
    spread   decode batch B whose contexts average C but are spread evenly over C +- W, with
             its uniform twin (every context C) in the same rounds
    overhead host time per engine step outside execute_model (schedule + update), by batch

Timing is interleaved (`measure_interleaved`): every point is warmed up, then timed once per
round in a shuffled order, so that slow drifts of the machine's state (GPU clocks under a
launch-bound eager runner) spread over all points instead of biasing whole rows.

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pagesim.config import EngineConfig
from pagesim.gpu.calibration_grid import CalibrationGrid, CalibrationRows, median_p10_p90
from pagesim.gpu.overhead import overhead_requests, overhead_rows
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput, is_decode

__all__ = [
    "BlockSource",
    "CalibrationGrid",
    "CalibrationRows",
    "Progress",
    "Timing",
    "calibrate_block_size",
    "decode_points",
    "grid_points",
    "measure_interleaved",
    "overhead_requests",
    "overhead_rows",
    "prefill_points",
    "round_order_rng",
    "spread_contexts",
    "synthetic_step",
]

Progress = Callable[[int, int, str], None]  # (done, total, label)


@dataclass
class Timing:
    """Median and spread of repeated wall times, seconds."""

    median: float
    p10: float
    p90: float
    samples: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, samples: list[float]) -> Timing:
        return cls(*median_p10_p90(samples), list(samples))


class BlockSource:
    """Hands out block ids from a seeded permutation of `1 .. num_blocks - 1`, restarting
    for every grid point (a point's sequences never share a block).

    `group_windows` (a runner under the hybrid KV layout: one entry per KV cache group, its
    sliding window or None) makes `synthetic_step` hand every sequence one row per group, as
    the hybrid manager does."""

    def __init__(
        self, num_blocks: int, seed: int = 0, group_windows: tuple[int | None, ...] | None = None
    ) -> None:
        self.ids = (np.random.default_rng(seed).permutation(num_blocks - 1) + 1).tolist()
        self.group_windows = group_windows

    @classmethod
    def for_runner(cls, runner, seed: int = 0) -> BlockSource:
        """The blocks of `runner`'s cache, in rows shaped as its KV layout reads them."""
        layout = getattr(runner, "kv_layout", None)
        windows = None
        if layout is not None and layout.is_hybrid:
            spec = runner.spec
            windows = tuple(
                spec.sliding_window if kind == "sliding" else None for kind in layout.group_kinds
            )
        return cls(runner.num_gpu_blocks, seed, group_windows=windows)

    def take(self, counts: list[int], from_end: bool = False) -> list[list[int]] | None:
        """Rows of `counts[i]` distinct blocks, or None if the cache cannot hold them all;
        `from_end` hands them out from the far end of the permutation (`WRITER_KINDS`)."""
        if sum(counts) > len(self.ids):
            return None
        ids = self.ids[::-1] if from_end else self.ids
        rows, at = [], 0
        for c in counts:
            rows.append(ids[at : at + c])
            at += c
        return rows


def _request(
    rid: str, index: int, context: int, num_new: int, prompts: dict[int, list[int]]
) -> Request:
    """A request whose step computes `num_new` tokens over `context` cached ones.

    Decode shape (num_new == 1, context > 0): prompt of `context` tokens plus one sampled
    token, as after its prefill. Otherwise: a prompt of `context + num_new` tokens. Prompt
    lists are shared through `prompts` (length -> tokens) so big batches build quickly.
    The sampled token differs per request (`index`), as in a served batch: an MoE layer
    routes each token by its hidden state, so a batch of one repeated token would pick one
    top-k set of experts and read a fraction of the weights a served step reads.
    """
    decode = is_decode(num_new, context)
    n = context if decode else context + num_new
    if n not in prompts:
        prompts[n] = [(j * 104_729 + 17) % 32_000 for j in range(n)]
    req = Request(rid, prompts[n], max_tokens=1 << 20)
    if decode:
        req.output_token_ids.append((index * 7_919 + 7) % 32_000)
    return req


def synthetic_step(
    entries: list[tuple[int, int]],
    block_size: int,
    blocks: BlockSource,
    step_id: int = 0,
    shared: int = 0,
    request_prefix: str = "cal",
    from_end: bool = False,
) -> SchedulerOutput | None:
    """A step of `(context, num_new)` entries (decodes first, as a running batch), or None if
    its K/V does not fit in the cache. With `shared` (tokens, a multiple of the block size, at
    most every context), every entry's first `shared // block_size` blocks are the same ones,
    as when the sequences hit one cached prefix. Requests are named `<request_prefix>-<k>`:
    the graph path keeps a block-table row per request id (`BlockTableRows`), so steps that
    should each find their own rows in place, as a served request does, need prefixes of
    their own."""
    rows = _rows(entries, block_size, blocks, shared, from_end)
    if rows is None:
        return None
    out = SchedulerOutput(step_id=step_id, block_size=block_size)
    prompts: dict[int, list[int]] = {}
    for k, ((ctx, new), row) in enumerate(zip(entries, rows, strict=False)):
        req = _request(f"{request_prefix}-{k}", k, ctx, new, prompts)
        out.scheduled.append(ScheduledRequest(req, new, ctx, row))
        out.total_num_scheduled_tokens += new
    return out


def _rows(
    entries: list[tuple[int, int]],
    block_size: int,
    blocks: BlockSource,
    shared: int,
    from_end: bool = False,
) -> list | None:
    """Each entry's block-table row, or under `blocks.group_windows` its row per KV cache
    group: a sliding group's blocks wholly before the first new token's window are the null
    block, as the hybrid manager frees them, and only full-attention rows share the prefix."""
    common = shared // block_size
    windows = blocks.group_windows or (None,)
    counts: list[int] = []
    nulls: list[list[int]] = []
    for window in windows:
        first = [0 if window is None else max(0, c - window + 1) // block_size for c, _ in entries]
        nulls.append(first)
        counts.append(common if window is None else 0)
        counts.extend(
            -(-(c + n) // block_size) - (common if window is None else f)
            for (c, n), f in zip(entries, first, strict=True)
        )
    taken = blocks.take(counts, from_end)
    if taken is None:
        return None
    per_group = []
    for g, window in enumerate(windows):
        part = taken[g * (len(entries) + 1) : (g + 1) * (len(entries) + 1)]
        head = part[0]
        per_group.append(
            [
                (head + row) if window is None else [0] * f + row
                for row, f in zip(part[1:], nulls[g], strict=True)
            ]
        )
    if blocks.group_windows is None:
        return per_group[0]
    return [tuple(group_rows) for group_rows in zip(*per_group, strict=True)]


def round_order_rng(seed: int) -> np.random.Generator:
    """The generator whose permutations order `measure_interleaved`'s timed rounds."""
    return np.random.default_rng([seed, 0xCA11])


def measure_interleaved(
    runner,
    items: list[tuple[SchedulerOutput, bool]],
    grid: CalibrationGrid,
    *,
    seed: int = 0,
    deadline: float | None = None,
    tick: Callable[[], None] | None = None,
) -> list[Timing]:
    """Time `execute_model(out)` (with attention skipped where the flag says so) for every
    item, in interleaved rounds, on the host clock (the call ends with a device sync).

    Two warm-up calls per item in grid order (Triton compiles on first use), then rounds: each
    round times every item once, in a fresh seeded random order. Why rounds and not all repeats
    of one point back to back: a launch-bound eager step's time depends on the GPU's clock
    state, which drifts over seconds (measured: runs of ~30 slow steps after a heavy step), so
    consecutive repeats share one state and neighbouring grid points would land in different
    ones; interleaving spreads every point over the same mix of states. The number of rounds
    fits the deadline (at least `grid.min_repeats`, at most `grid.repeats`). Python's cyclic GC
    is paused while timing, as during a real run (`serve.replay`).
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        est = []
        for out, skip in items:
            runner.skip_attention = skip
            runner.execute_model(out)
            t = time.perf_counter()
            runner.execute_model(out)
            est.append(time.perf_counter() - t)
            if tick is not None:
                tick()
        per_round = max(sum(est), 1e-6)
        rounds = grid.repeats
        if deadline is not None:
            fit = int((deadline - time.monotonic()) / per_round)
            rounds = max(grid.min_repeats, min(grid.repeats, fit))
        rng = round_order_rng(seed)
        samples: list[list[float]] = [[] for _ in items]
        for _ in range(rounds):
            for i in rng.permutation(len(items)).tolist():
                out, skip = items[i]
                runner.skip_attention = skip
                t = time.perf_counter()
                runner.execute_model(out)
                samples[i].append(time.perf_counter() - t)
        return [Timing.of(x) for x in samples]
    finally:
        runner.skip_attention = False
        if gc_was_enabled:
            gc.enable()


def spread_contexts(batch: int, mean: int, half_width: int, seed: int) -> list[int]:
    """`batch` contexts evenly over [mean - half_width, mean + half_width] in a seeded random
    order (their mean is `mean` up to rounding): a decode_spread row's step."""
    if batch == 1 or half_width == 0:
        return [mean] * batch
    xs = np.linspace(mean - half_width, mean + half_width, batch).round().astype(int)
    np.random.default_rng(seed).shuffle(xs)
    return xs.tolist()


def fitted_spread(mean: int, half_width: int, max_model_len: int) -> tuple[int, int]:
    """A decode_spread point, mean and half width scaled down alike until its longest context
    fits the model: without spread rows a graph's padding rows are priced as real sequences,
    and a short model (opt-13b's 2,048 tokens cannot hold 1,800 +- 1,700) would get none.
    Points that fit are unchanged."""
    if mean + half_width + 1 <= max_model_len:
        return mean, half_width
    scale = (max_model_len - 1) / (mean + half_width)
    return int(mean * scale), int(half_width * scale)


def decode_points(
    grid: CalibrationGrid, max_model_len: int, capacity_tokens: int, max_num_seqs: int
) -> list[tuple[int, int]]:
    """(batch, context) pairs that a server could run: context + 1 <= max_model_len, every
    sequence's blocks fit, batch <= max_num_seqs. The longest context is capped to
    max_model_len - 1 so that the row ends at the model's limit."""
    contexts = sorted({min(c, max_model_len - 1) for c in grid.decode_contexts})
    return [
        (b, c)
        for b in grid.decode_batches
        for c in contexts
        if b <= max_num_seqs and b * (c + 1) <= capacity_tokens
    ]


def prefill_points(
    grid: CalibrationGrid, max_model_len: int, max_num_batched_tokens: int
) -> list[tuple[int, int]]:
    return [
        (n, k)
        for n in grid.prefill_tokens
        for k in grid.prefill_cached
        if n <= max_num_batched_tokens and n + k <= max_model_len
    ]


def calibration_entries(
    grid: CalibrationGrid, config: EngineConfig, *, full: bool, capacity: int
) -> list[tuple[str, tuple[int, ...], list[tuple[int, int]], tuple]]:
    """The grid's points that a server of `config` (its block size and step limits) could
    run, as (kind, key, (context, new tokens) entries, key of its attention-skipped twin):
    every entry's context plus new tokens within `max_model_len` (a block-table row never
    longer than the CUDA graphs' table), every step within the token and sequence budgets."""
    block_size, max_model_len = config.block_size, config.max_model_len
    max_num_batched_tokens, max_num_seqs = config.max_num_batched_tokens, config.max_num_seqs
    entries: list[tuple[str, tuple[int, ...], list[tuple[int, int]], tuple]] = []
    for b, c in decode_points(grid, max_model_len, capacity, max_num_seqs):
        entries.append(("decode", (b, c), [(c, 1)] * b, ("decode", b)))
    if full:
        for n, k in prefill_points(grid, max_model_len, max_num_batched_tokens):
            entries.append(("prefill", (n, k), [(k, n)], ("prefill", n)))
        for n, k, b, c in grid.mixed:
            if (
                n + k <= max_model_len
                and c + 1 <= max_model_len
                and n + b <= max_num_batched_tokens
                and b + 1 <= max_num_seqs
            ):
                entries.append(("mixed", (n, k, b, c), [(c, 1)] * b + [(k, n)], ("mixed", n, b)))
        for k, n, c in grid.multi_prefill:
            if k * n <= max_num_batched_tokens and n + c <= max_model_len and k <= max_num_seqs:
                entries.append(("multi", (k, n, c), [(c, n)] * k, ("multi", k, n)))
        plain = {key for kind, key, _, _ in entries if kind == "decode"}
        for b, c, sh in grid.decode_shared:
            if (
                b <= max_num_seqs
                and c + 1 <= max_model_len
                and sh % block_size == 0
                and 0 < sh <= c
            ):
                entries.append(("shared", (b, c, sh), [(c, 1)] * b, ("decode", b)))
                if (b, c) not in plain:  # its reference: the same step over distinct blocks
                    plain.add((b, c))
                    entries.append(("reference", (b, c), [(c, 1)] * b, ("decode", b)))
        for b, c, w in grid.decode_spread:
            c, w = fitted_spread(c, w, max_model_len)
            spec = [(x, 1) for x in spread_contexts(b, c, w, seed=b * 7919 + w)]
            if b <= max_num_seqs and c + w + 1 <= max_model_len and 0 < w < c:
                entries.append(("spread", (b, c, max(x for x, _ in spec)), spec, ("decode", b)))
                if (b, c) not in plain:  # its uniform twin
                    plain.add((b, c))
                    entries.append(("reference", (b, c), [(c, 1)] * b, ("decode", b)))
        for b, sh, own, w in grid.decode_shared_spread:
            contexts = [sh + x for x in spread_contexts(b, own, w, seed=b * 7919 + sh)]
            if (
                b <= max_num_seqs
                and max(contexts) + 1 <= max_model_len
                and sh % block_size == 0
                and 0 < sh
                and 0 < w < own
            ):
                key = (b, sh + own, max(contexts), sh)
                spec = [(x, 1) for x in contexts]
                entries.append(("sshared", key, spec, ("decode", b)))
                entries.append(("sreference", key, spec, ("decode", b)))
        for d, dc, k, n, sh in grid.varlen_shared:
            spec = [(dc, 1)] * d + [(sh, n)] * k
            if (
                d + k <= max_num_seqs
                and d + k * n <= max_num_batched_tokens
                and max(dc + 1, sh + n) <= max_model_len
                and sh % block_size == 0
                and (not d or sh <= dc)
            ):
                key = (d, dc, k, n, sh)
                entries.append(("vshared", key, spec, ("vshared", d, k, n)))
                entries.append(("vreference", key, spec, ("vshared", d, k, n)))
    return entries


#: Kinds whose steps write whole prompts into the cache. Their rows come from the far end of
#: the block permutation, so that no decode point reads K/V that a prefill of the shared
#: synthetic prompt left there: an MoE router reads each token's hidden state, and decode
#: rows holding that one prompt's K/V steer a batch's tokens to the same few experts (a
#: fraction of the weights a served batch reads, whose sequences each hold their own).
WRITER_KINDS = frozenset({"prefill", "mixed", "multi", "vshared", "vreference"})


def grid_points(
    entries: list[tuple], block_size: int, blocks: BlockSource
) -> list[tuple[str, tuple, SchedulerOutput, tuple]]:
    """(kind, key, step, other key) of every `calibration_entries` entry whose blocks fit.

    Each point names its requests apart (`cal<i>-<k>`): its block-table rows are written at
    its first warm-up and found in place at every timed call, as a served request's are from
    one step to the next.
    """
    points = []
    for i, (kind, key, spec, other) in enumerate(entries):
        shared = key[-1] if kind in ("shared", "vshared", "sshared") else 0
        out = synthetic_step(
            spec,
            block_size,
            blocks,
            shared=shared,
            request_prefix=f"cal{i}",
            from_end=kind in WRITER_KINDS,
        )
        if out is not None:
            points.append((kind, key, out, other))
    return points


def calibrate_block_size(
    runner,
    grid: CalibrationGrid,
    *,
    progress: Progress | None = None,
    seed: int = 0,
    deadline: float | None = None,
) -> CalibrationRows:
    """All rows of the runner's block size (all kinds for the grid's `full_block_sizes`, the
    decode points for the others), within the step limits of the engine it serves
    (`runner.config`: the points are the ones that server could run).

    `other_ms` (attention skipped) is timed once per decode batch, per prefill token count, per
    (new tokens, decodes) of the mixed points and per (entries, new tokens) of the
    multi-prefill points, in the same interleaved rounds as the full steps.
    """
    block_size = runner.config.block_size
    blocks = BlockSource.for_runner(runner, seed)
    capacity = (runner.num_gpu_blocks - 1) * block_size
    full = block_size in grid.full_block_sizes
    entries = calibration_entries(grid, runner.config, full=full, capacity=capacity)
    points = grid_points(entries, block_size, blocks)
    other_index: dict[tuple, int] = {}
    items: list[tuple[SchedulerOutput, bool]] = [(p[2], False) for p in points]
    for p in points:
        if p[3] not in other_index:
            other_index[p[3]] = len(items)
            items.append((p[2], True))
    total = len(items)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, f"bs={block_size} warm-up")

    timings = measure_interleaved(runner, items, grid, seed=seed, deadline=deadline, tick=tick)
    if progress is not None:
        rounds = len(timings[0].samples) if timings else 0
        progress(total, total, f"bs={block_size} {rounds} rounds timed")
    plain_ms = {
        key: timings[i].median * 1e3
        for i, (kind, key, _, _) in enumerate(points)
        if kind in ("decode", "reference")
    }
    twin_ms = {
        (kind, key): timings[i].median * 1e3
        for i, (kind, key, _, _) in enumerate(points)
        if kind in ("vreference", "sreference")
    }
    # kind -> table; shared rows carry their unshared reference time
    plain_kinds = {
        "decode": "decode",
        "prefill": "prefill",
        "mixed": "mixed",
        "multi": "multi_prefill",
    }
    rows = CalibrationRows.empty()
    for i, (kind, key, _, other) in enumerate(points):
        t = timings[i]
        o = timings[other_index[other]].median
        fields = (block_size, *key, *_ms(t), max(0.0, t.median - o) * 1e3, min(o, t.median) * 1e3)
        if kind in plain_kinds:
            rows.add(plain_kinds[kind], *fields)
        elif kind == "shared" and key[:2] in plain_ms:
            rows.add("decode_shared", *fields, plain_ms[key[:2]])
        elif kind == "vshared" and ("vreference", key) in twin_ms:
            rows.add("varlen_shared", *fields, twin_ms["vreference", key])
        elif kind == "sshared" and ("sreference", key) in twin_ms:
            rows.add("decode_shared_spread", *fields, twin_ms["sreference", key])
        elif kind == "spread" and key[:2] in plain_ms:
            rows.add("decode_spread", *fields, plain_ms[key[:2]])
    return rows


def _ms(t: Timing) -> tuple[float, float, float]:
    return t.median * 1e3, t.p10 * 1e3, t.p90 * 1e3
