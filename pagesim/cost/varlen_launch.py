"""Attention time of the steps that run the variable-length (prefill) kernel, from its programs.

A step with any prefill entry runs one variable-length attention launch per layer over all its
sequences, decodes included (a decode is a sequence of one query token). The launch has one
program per (query block of `block_q` tokens, KV head); a program streams its keys tile by
tile (`tile_n` keys) however many of its rows are real, so a decode in a mixed step costs
a whole query block over its context. Per KV head, entry i (q new tokens over c cached) owns
`nb = ceil(q / block_q)` programs with `c + min((j + 1) * block_q, q)` keys (j < nb): causal.
A program's length is its keys / tile_n + o tile iterations, o its fixed cost (loading its
query block, the softmax's end, writing its rows), fitted with the rest (`fit_varlen_overhead`).

    t = alpha[mode] + beta * makespan(programs, slots) + gamma * surplus

    makespan  the time, in tile iterations, that `slots` programs running at once take over
              the launch's programs, handed out in grid order: the grid is (query blocks,
              KV heads), so every program of head 0 goes first, then head 1's, ...; a
              program starts when a slot frees (`makespan`)
    slots     programs the GPU runs at once, all heads together (fitted: about one per SM)
    surplus   programs per KV head that only find they have no rows and exit: the grid is
              tokens // block_q + sequences, sized on the host; a CUDA graph of a mixed step
              is launched at its padded tokens and min(padded tokens, largest decode graph)
              sequences, so most of its programs are surplus
    alpha     per mode (a graph replay or an eager launch from Python), seconds

Why the order matters: a served mixed step holds a few new tokens and decodes of very unequal
contexts, and the longest decode program of the last head is handed out after the other heads'
work, so the step lasts about that work over the slots plus that program, not the longest
program as if it ran alone (the measured comparison: docs/cost_model.md).

Shared-prefix reads are discounted by `Launch.reread` (`pagesim.cost.corrections.reread`);
why this model and not one residual per prefill entry: `pagesim.cost.corrections.varlen`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from pagesim.cost.base import BatchShape

#: Tile iterations a program spends outside its key loop, until a fit says otherwise (the
#: decode split rule's figure).
PROGRAM_OVERHEAD_TILES = 1.0
#: The overheads the fit tries (`fit_varlen_overhead`).
OVERHEAD_GRID = (0.5, 1.0, 2.0, 3.0, 4.0, 6.0)
#: Slot counts tried by the fit (programs running at once, all KV heads), geometric 1-8192.
SLOTS_GRID = tuple(sorted({int(round(x)) for x in np.geomspace(1.0, 8192.0, 121)}))


@dataclass(frozen=True, slots=True)
class VarlenKernel:
    """How the runner launched the kernel: query tokens per program, keys per tile, the
    sequence count of a mixed graph (`min(padded tokens, max_graph_seqs)`) and the KV heads
    (the grid's second axis) per GPU; and a program's fixed cost in tile iterations (loading
    its query block, the softmax's end, writing its rows: fitted, `fit_varlen_overhead`)."""

    block_q: int
    tile_n: int
    max_graph_seqs: int
    num_kv_heads: int = 1
    program_overhead: float = PROGRAM_OVERHEAD_TILES


@dataclass(slots=True)
class Launch:
    """One step's launch: per KV head, work W and critical path L (tile iterations),
    programs with rows and programs launched; `context_work` is the part of W spent reading
    cached context (decodes' contexts, prefill entries' cached prefixes), the part that
    shared prefix blocks make cheaper. One head's programs, in grid order, are a decode per
    sequence (as the batch lists them: `decode_sum` keys of context in all, the longest at
    `longest_decode` with `longest_context` keys, the last with `last_context`) and then each
    of `entries`' query blocks; `heads` is the grid's KV heads and `scale` what shared-prefix
    reads leave of every program's length."""

    work: float
    longest: float
    used: int
    launched: int
    context_work: float = 0.0
    num_decodes: int = 0
    decode_sum: float = 0.0
    longest_decode: int = 0
    longest_context: float = 0.0
    last_context: float = 0.0
    entries: tuple[tuple[int, int], ...] = ()
    block_q: int = 1
    tile_n: int = 1
    heads: int = 1
    scale: float = 1.0
    overhead: float = PROGRAM_OVERHEAD_TILES  # a program's fixed tile iterations

    @property
    def surplus(self) -> int:
        return max(self.launched - self.used, 0)

    def reread(self, duplicate_fraction: float, reread_cost: float) -> Launch:
        """This launch when `duplicate_fraction` of its cached-context reads are of blocks
        that other sequences of the step read too, each costing `reread_cost` of a private
        read. The saving shortens every program alike (a share of the work)."""
        saved = (1.0 - reread_cost) * duplicate_fraction * self.context_work
        left = (self.work - saved) / self.work if self.work > 0 else 1.0
        return replace(
            self,
            work=self.work - saved,
            context_work=self.context_work - saved,
            scale=self.scale * left,
        )

    def candidates(self) -> list[tuple[int, float]]:
        """(index, length) of the programs that end the launch, nearly always: the longest
        decode and the last one, and every entry's last query block (its longest: causal). A
        decode between the first two is no longer than the first and starts before the
        second."""
        tile, fixed = self.tile_n, self.overhead
        nd = self.num_decodes
        out = []
        if nd:
            out.append((self.longest_decode, (self.longest_context + 1.0) / tile + fixed))
            if self.longest_decode != nd - 1:
                out.append((nd - 1, (self.last_context + 1.0) / tile + fixed))
        at = nd
        for q, c in self.entries:
            at += -(-q // self.block_q)
            out.append((at - 1, (c + q) / tile + fixed))
        return out

    def _prefix(self, i: int) -> float:
        """Tile iterations of one head's programs before program `i`; the decodes' share
        is taken as evenly spread over them (their order within a head moves a program's
        start by at most one head's work over all slots)."""
        tile, nd, fixed = float(self.tile_n), self.num_decodes, self.overhead
        per_decode = (self.decode_sum / nd + 1.0) / tile + fixed if nd else 0.0
        if i <= nd:
            return i * per_decode
        acc = nd * per_decode
        i -= nd
        bq = self.block_q
        for q, c in self.entries:
            nb = -(-q // bq)
            if i < nb:  # blocks 0 .. i-1 of this entry, none of them its last
                return acc + (i * c + bq * i * (i + 1) / 2) / tile + i * fixed
            acc += (nb * c + bq * (nb - 1) * nb / 2 + q) / tile + nb * fixed
            i -= nb
        return acc

    def prefixes(self) -> list[float]:
        """`[self._prefix(i) for i in range(self.used)]` in one pass over the entries (the fit
        reads every program's start; `_prefix` walks the entries again for each). Every value
        is the same expression as `_prefix`'s, so the floats are the same."""
        n = self.used
        tile, nd, fixed = float(self.tile_n), self.num_decodes, self.overhead
        per_decode = (self.decode_sum / nd + 1.0) / tile + fixed if nd else 0.0
        out = [i * per_decode for i in range(min(n, nd + 1))]  # `_prefix`'s i <= nd
        acc = nd * per_decode
        i = 1  # the next program's index past the decodes, as `_prefix` counts it
        bq = self.block_q
        for q, c in self.entries:
            if len(out) >= n:
                break
            nb = -(-q // bq)
            while i < nb and len(out) < n:
                out.append(acc + (i * c + bq * i * (i + 1) / 2) / tile + i * fixed)
                i += 1
            acc += (nb * c + bq * (nb - 1) * nb / 2 + q) / tile + nb * fixed
            i -= nb
        out.extend([acc] * (n - len(out)))
        return out

    def makespan(self, slots: int) -> float:
        """Tile iterations from the first program's start to the last one's end, with
        `slots` programs running at once.

        The grid's programs are handed out in order, every head's programs in turn, each to
        the first slot that frees. Exact scheduling is a loop over every program of every
        head, too slow for a simulator step; this is its fluid form: the k-th program
        (k >= slots) starts once the work handed out before it, less what is still running
        (about half of the last `slots` programs' work), is done at `slots` programs at a
        time: start_k = (A_k + A_(k - slots)) / (2 * slots), A the work before a program;
        the first `slots` programs start at once. Every head holds the same programs, so the
        last head's end last, and of those only `candidates` can end the launch. The result
        lies within the bounds of the exact schedule, max(longest, work / slots) and
        work / slots + longest (tests/cost/test_varlen.py).
        """
        n, heads = self.used, self.heads
        if n == 0:
            return 0.0
        if heads * n <= slots:
            return self.scale * self.longest
        w = self.work / self.scale  # the programs' own work, before `scale`
        best = max(self.longest, heads * w / slots)
        for j, length in self.candidates():
            k = (heads - 1) * n + j
            if k < slots:
                continue
            q, r = divmod(k - slots, n)
            start = ((heads - 1) * w + self._prefix(j) + q * w + self._prefix(r)) / (2 * slots)
            best = max(best, start + length)
        return self.scale * best


def makespans(launch: Launch, slots: Sequence[int]) -> np.ndarray:
    """`launch.makespan` at every slot count of `slots` at once (numpy), for the fit."""
    p = np.asarray(slots, dtype=np.int64)
    n, heads = launch.used, launch.heads
    if n == 0:
        return np.zeros(len(p))
    before = np.array(launch.prefixes())  # work before each program
    w = launch.work / launch.scale
    best = np.maximum(launch.longest, heads * w / p)
    for j, length in launch.candidates():
        m = (heads - 1) * n + j - p
        mm = np.maximum(m, 0)
        start = ((heads - 1) * w + before[j] + (mm // n) * w + before[mm % n]) / (2 * p)
        best = np.where(m >= 0, np.maximum(best, start + length), best)
    return launch.scale * np.where(heads * n <= p, launch.longest, best)


def launch_of(
    kernel: VarlenKernel,
    entries: list[tuple[int, int]],
    decode_contexts: Sequence[float],
    padded_tokens: int | None,
) -> Launch:
    """The launch of a step of prefill `entries` (new, cached) plus decodes of the given
    contexts, in batch order; `padded_tokens` is the graph's size (None: eager)."""
    bq, tile, fixed = kernel.block_q, float(kernel.tile_n), kernel.program_overhead
    if not isinstance(decode_contexts, list):  # a view computed on read: read it once
        decode_contexts = list(decode_contexts)
    num_decodes = len(decode_contexts)
    decode_sum = sum(decode_contexts)
    work = (decode_sum + num_decodes) / tile + num_decodes * fixed
    context_work = decode_sum / tile
    most: float
    last: float
    longest, most, at_most, last = 0.0, 0, 0, 0
    if num_decodes:
        most, last = max(decode_contexts), decode_contexts[-1]
        at_most = decode_contexts.index(most)
        longest = (most + 1) / tile + fixed
    used = num_decodes
    tokens = num_decodes
    for q, c in entries:
        nb = -(-q // bq)
        keys = nb * c + bq * (nb - 1) * nb / 2 + q
        work += keys / tile + nb * fixed
        context_work += nb * c / tile
        longest = max(longest, (c + q) / tile + fixed)
        used += nb
        tokens += q
    seqs = num_decodes + len(entries)
    if padded_tokens is None:
        launched = tokens // bq + seqs
    else:
        launched = padded_tokens // bq + min(padded_tokens, kernel.max_graph_seqs)
    return Launch(
        work,
        longest,
        used,
        launched,
        context_work,
        num_decodes,
        decode_sum,
        at_most,
        most,
        last,
        tuple(entries),
        bq,
        kernel.tile_n,
        kernel.num_kv_heads,
        overhead=fixed,
    )


def shape_launch(kernel: VarlenKernel, b: BatchShape, padded_tokens: int | None) -> Launch:
    """`launch_of` a `BatchShape` (decode contexts from its list, else all at their mean)."""
    n = b.num_decode_seqs
    ctx: Sequence[float] = b.decode_context_tokens
    if len(ctx) != n:
        ctx = [b.decode_context_sum / n] * n
    return launch_of(
        kernel,
        list(zip(b.prefill_new_tokens, b.prefill_context_tokens, strict=True)),
        ctx,
        padded_tokens,
    )


@dataclass(frozen=True, slots=True)
class VarlenFit:
    """Fitted coefficients of one block size (seconds; `slots` in programs)."""

    alpha_graph: float
    alpha_eager: float
    beta: float
    gamma: float
    slots: int
    rms: float  # root mean square of the fit's error over its rows, as a fraction of the step

    def __call__(self, launch: Launch, graph: bool) -> float:
        return (
            (self.alpha_graph if graph else self.alpha_eager)
            + self.beta * launch.makespan(self.slots)
            + self.gamma * launch.surplus
        )


def fit_varlen(rows: list[tuple[Launch, bool, float, float]]) -> VarlenFit | None:
    """Fit on `(launch, graph?, attention seconds, step seconds)` rows; None if fewer than 5.

    For every slot count of `SLOTS_GRID`, least squares on the four linear terms
    (coefficients >= 0: each is a kind of work), errors relative to the row's step time; the
    slot count with the smallest error wins. A mode without rows gets the other's alpha.
    """
    if len(rows) < 5:
        return None
    graph = np.array([r[1] for r in rows], dtype=float)
    att = np.array([r[2] for r in rows], dtype=float)
    weight = 1.0 / np.array([r[3] for r in rows], dtype=float)
    surplus = np.array([r[0].surplus for r in rows], dtype=float)
    spans = np.stack([makespans(r[0], SLOTS_GRID) for r in rows], axis=1)  # [slots, rows]
    best: tuple[float, int, list[float]] | None = None
    # the weighted columns that do not depend on the slot count, made once
    eager = 1.0 - graph
    graph_w, eager_w = graph * weight, eager * weight
    surplus_w, att_w = surplus * weight, att * weight
    for slots, span in zip(SLOTS_GRID, spans, strict=True):
        terms = [graph, eager, span, surplus]
        coef = nonnegative_lstsq([graph_w, eager_w, span * weight, surplus_w], att_w)
        pred = sum(c * t for c, t in zip(coef, terms, strict=True))
        sse = float(np.sum(((pred - att) * weight) ** 2))
        if best is None or sse < best[0]:
            best = (sse, slots, coef)
    assert best is not None  # SLOTS_GRID is not empty
    sse, slots, coef = best
    a_graph, a_eager = coef[0], coef[1]
    if not graph.any():
        a_graph = a_eager
    elif graph.all():
        a_eager = a_graph
    return VarlenFit(a_graph, a_eager, coef[2], coef[3], slots, (sse / len(rows)) ** 0.5)


def fit_varlen_overhead(
    kernel: VarlenKernel, rows: dict[int, list[tuple[BatchShape, int | None, float, float]]]
) -> tuple[VarlenKernel, dict[int, VarlenFit]]:
    """The kernel with its program overhead fitted, and one `VarlenFit` per block size.

    `rows`: block size -> `(shape, padded tokens or None, attention seconds, step seconds)`.
    For each overhead of `OVERHEAD_GRID`, `fit_varlen` per block size; the overhead whose
    fits leave the least squared relative error over all rows wins (one for the kernel: the
    program's fixed work does not depend on the block size). Why fit it: with one tile, long
    causal prefills (few, long programs) and chunks with many decodes (many short programs)
    were priced off in opposite directions.
    """
    best: tuple[float, VarlenKernel, dict[int, VarlenFit]] | None = None
    for overhead in OVERHEAD_GRID:
        k = replace(kernel, program_overhead=overhead)
        fits, sse = {}, 0.0
        for bs, v in sorted(rows.items()):
            fit = fit_varlen(
                [
                    (shape_launch(k, shape, padded), padded is not None, att, step)
                    for shape, padded, att, step in v
                ]
            )
            if fit is not None:
                fits[bs] = fit
                sse += fit.rms**2 * len(v)
        if fits and (best is None or sse < best[0]):
            best = (sse, k, fits)
    return (best[1], best[2]) if best is not None else (kernel, {})


def nonnegative_lstsq(terms: list, z: np.ndarray) -> list[float]:
    """Least squares z ~ sum(c_k * term_k) with every c_k >= 0 (each term is a kind of work,
    which never saves time): refit without the most negative coefficient until none is left.
    Columns are scaled to unit max for conditioning; an all-zero column gets 0."""
    # scalar terms are broadcast; full columns go in as they are (the same values)
    a = np.stack(
        [t if np.shape(t) == z.shape else np.broadcast_to(t, z.shape) for t in terms], axis=1
    )
    scale = np.max(np.abs(a), axis=0)
    scale[scale == 0] = 1.0
    scaled = a / scale  # every column scaled once: the quotients each refit would take
    active = list(range(a.shape[1]))
    coef = [0.0] * a.shape[1]
    while active:
        cols = scaled if len(active) == a.shape[1] else scaled[:, active]
        sol = np.linalg.lstsq(cols, z, rcond=None)[0] / scale[active]
        if sol.min() >= 0.0:
            for k, x in zip(active, sol.tolist(), strict=True):
                coef[k] = x
            break
        active.pop(int(np.argmin(sol)))
    return coef
