"""Attention time of the steps that run the variable-length (prefill) kernel, from its programs.

A step with any prefill entry runs one variable-length attention launch per layer over all its
sequences, decodes included (a decode is a sequence of one query token). The launch has one
program per (query block of `block_q` tokens, KV head); a program streams its keys tile by
tile (`tile_n` keys) however many of its rows are real, so a decode in a mixed step costs
a whole query block over its context. Per KV head, entry i (q new tokens over c cached) owns
`nb = ceil(q / block_q)` programs with `c + min((j + 1) * block_q, q)` keys (j < nb): causal.

    t = alpha[mode] + beta * max(W / S, L) + gamma * surplus

    W        sum over programs of (keys / tile_n + 1): the work, in tile iterations (+1: the
             program's own prologue and epilogue, as the decode split rule counts it)
    L        the longest program's (keys / tile_n + 1): the critical path
    S        programs per KV head the GPU runs at once (fitted; ~ SMs / KV heads)
    surplus  programs per KV head that only find they have no rows and exit: the grid is
             tokens // block_q + sequences, sized on the host; a CUDA graph of a mixed step
             is launched at its padded tokens and min(padded tokens, largest decode graph)
             sequences, so most of its programs are surplus
    alpha    per mode (a graph replay or an eager launch from Python), seconds

Shared prefixes: when the step's sequences hold fewer distinct tokens U than their cached
contexts add up to (C), a fraction (C - U) / C of the context reads are of blocks another
sequence reads too; they cost `reread` of a first read (`Launch.reread`), a fraction fitted on
calibration rows with shared prefixes against their unshared references.

Why this and not one measured residual per prefill entry summed over the entries: the per-entry
sum counts the launch and the under-filled GPU of a lone entry once per entry (16 alike entries
of 512 tokens: +31 % on the H200), and it cannot see that a decode row costs a whole query
block in this kernel (a 256-token chunk with 128 decodes of llama-2-7b: -39 %). Fitted on the
calibration's prefill, mixed and multi-prefill rows (their attention: step time minus the
`other` line of their mode), one fit per block size, it reproduces those rows to ~3 % rms of
their step time on the H200 profiles (`fit_varlen`'s `rms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagesim.cost.base import BatchShape, longest_context

#: Tile iterations a program spends outside its key loop (the decode split rule's figure).
PROGRAM_OVERHEAD_TILES = 1.0
#: Concurrency values tried by the fit (programs per KV head), geometric from 1 to 4096.
CONCURRENCY_GRID = tuple(float(x) for x in np.geomspace(1.0, 4096.0, 97))


@dataclass(frozen=True, slots=True)
class VarlenKernel:
    """How the runner launched the kernel: query tokens per program, keys per tile, and the
    sequence count of a mixed graph (`min(padded tokens, max_graph_seqs)`)."""

    block_q: int
    tile_n: int
    max_graph_seqs: int


@dataclass(frozen=True, slots=True)
class Launch:
    """One step's launch, per KV head: work W, critical path L (tile iterations), programs
    with rows, and programs launched; `context_work` is the part of W spent reading cached
    context (decodes' contexts, prefill entries' cached prefixes), the part that shared
    prefix blocks make cheaper."""

    work: float
    longest: float
    used: int
    launched: int
    context_work: float = 0.0

    @property
    def surplus(self) -> int:
        return max(self.launched - self.used, 0)

    def reread(self, duplicate_fraction: float, reread_cost: float) -> Launch:
        """This launch when `duplicate_fraction` of its cached-context reads are of blocks
        that other sequences of the step read too, each costing `reread_cost` of a private
        read."""
        saved = (1.0 - reread_cost) * duplicate_fraction * self.context_work
        return Launch(self.work - saved, self.longest, self.used, self.launched,
                      self.context_work - saved)


def launch_of(kernel: VarlenKernel, entries: list[tuple[int, int]], decode_context_sum: int,
              decode_context_max: int, num_decodes: int,
              padded_tokens: int | None) -> Launch:
    """The launch of a step of prefill `entries` (new, cached) plus `num_decodes` decodes of
    the given context sum and maximum; `padded_tokens` is the graph's size (None: eager)."""
    bq, tile = kernel.block_q, float(kernel.tile_n)
    work = (decode_context_sum + num_decodes) / tile + num_decodes * PROGRAM_OVERHEAD_TILES
    context_work = decode_context_sum / tile
    longest = (decode_context_max + 1) / tile + PROGRAM_OVERHEAD_TILES if num_decodes else 0.0
    used = num_decodes
    tokens = num_decodes
    for q, c in entries:
        nb = -(-q // bq)
        keys = nb * c + bq * (nb - 1) * nb / 2 + q
        work += keys / tile + nb * PROGRAM_OVERHEAD_TILES
        context_work += nb * c / tile
        longest = max(longest, (c + q) / tile + PROGRAM_OVERHEAD_TILES)
        used += nb
        tokens += q
    seqs = num_decodes + len(entries)
    if padded_tokens is None:
        launched = tokens // bq + seqs
    else:
        launched = padded_tokens // bq + min(padded_tokens, kernel.max_graph_seqs)
    return Launch(work, longest, used, launched, context_work)


def shape_launch(kernel: VarlenKernel, b: BatchShape, padded_tokens: int | None) -> Launch:
    """`launch_of` a `BatchShape` (decode contexts from its list, else their mean)."""
    n = b.num_decode_seqs
    longest = 0
    if n:
        ctx = b.decode_context_tokens
        longest = longest_context(ctx) if len(ctx) == n else -(-b.decode_context_sum // n)
    return launch_of(kernel, list(zip(b.prefill_new_tokens, b.prefill_context_tokens,
                                      strict=True)),
                     b.decode_context_sum, longest, n, padded_tokens)


@dataclass(frozen=True, slots=True)
class VarlenFit:
    """Fitted coefficients of one block size (seconds; `concurrency` in programs per head)."""

    alpha_graph: float
    alpha_eager: float
    beta: float
    gamma: float
    concurrency: float
    rms: float  # root mean square of the fit's error over its rows, as a fraction of the step

    def __call__(self, launch: Launch, graph: bool) -> float:
        return ((self.alpha_graph if graph else self.alpha_eager)
                + self.beta * max(launch.work / self.concurrency, launch.longest)
                + self.gamma * launch.surplus)


def fit_varlen(rows: list[tuple[Launch, bool, float, float]]) -> VarlenFit | None:
    """Fit on `(launch, graph?, attention seconds, step seconds)` rows; None if fewer than 5.

    For every concurrency of `CONCURRENCY_GRID`, least squares on the four linear terms
    (coefficients >= 0: each is a kind of work), errors relative to the row's step time; the
    concurrency with the smallest error wins. A mode without rows gets the other's alpha.
    """
    if len(rows) < 5:
        return None
    graph = np.array([r[1] for r in rows], dtype=float)
    att = np.array([r[2] for r in rows], dtype=float)
    weight = 1.0 / np.array([r[3] for r in rows], dtype=float)
    work = np.array([r[0].work for r in rows], dtype=float)
    longest = np.array([r[0].longest for r in rows], dtype=float)
    surplus = np.array([r[0].surplus for r in rows], dtype=float)
    best: tuple[float, float, list[float]] | None = None
    for s in CONCURRENCY_GRID:
        terms = [graph, 1.0 - graph, np.maximum(work / s, longest), surplus]
        coef = nonnegative_lstsq([t * weight for t in terms], att * weight)
        pred = sum(c * t for c, t in zip(coef, terms, strict=True))
        sse = float(np.sum(((pred - att) * weight) ** 2))
        if best is None or sse < best[0]:
            best = (sse, s, coef)
    sse, s, coef = best
    a_graph, a_eager = coef[0], coef[1]
    if not graph.any():
        a_graph = a_eager
    elif graph.all():
        a_eager = a_graph
    return VarlenFit(a_graph, a_eager, coef[2], coef[3], s, (sse / len(rows)) ** 0.5)


def nonnegative_lstsq(terms: list, z: np.ndarray) -> list[float]:
    """Least squares z ~ sum(c_k * term_k) with every c_k >= 0 (each term is a kind of work,
    which never saves time): refit without the most negative coefficient until none is left.
    Columns are scaled to unit max for conditioning; an all-zero column gets 0."""
    a = np.stack([np.broadcast_to(t, z.shape) for t in terms], axis=1)
    scale = np.max(np.abs(a), axis=0)
    scale[scale == 0] = 1.0
    active = list(range(a.shape[1]))
    coef = np.zeros(a.shape[1])
    while active:
        sol = np.linalg.lstsq(a[:, active] / scale[active], z, rcond=None)[0] / scale[active]
        if sol.min() >= 0.0:
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return [float(x) for x in coef]
