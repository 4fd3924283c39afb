"""Correction `varlen`: steps with prefill entries priced from the variable-length kernel's
programs.

A step with any prefill entry runs one variable-length attention launch per layer over all its
sequences, decodes included, so its attention is not the sum of one residual per entry: that
counts a lone entry's launch and under-filled GPU once per entry, and misses that a decode
costs a whole query block in this kernel. When the profile names the kernel's tiles, such a
step is priced as other(mode, tokens) plus the kernel's time from its launch grid
(`pagesim.cost.varlen_launch`), fitted per block size on the prefill, mixed and multi-prefill rows.
Off: the per-entry residuals, less `multi_part`'s shared cost. Switched off, the shipped
profiles' held-out MAPE rises 1.9 to 7.7 points, their mixed and multi-prefill rows' to 14-32 %
(docs/cost_model.md).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pagesim.cost.profile_rows import row_batch
from pagesim.cost.varlen_launch import VarlenFit, VarlenKernel, fit_varlen_overhead


def fit(
    model, rows: list[tuple[str, int, Any]]
) -> tuple[VarlenKernel | None, dict[int, VarlenFit]]:
    """The kernel (its program overhead fitted) and one `VarlenFit` per block size, from the
    rows that ran the kernel; (None, {}) when the profile does not name its tiles."""
    meta = model.profile.metadata
    if not (meta.varlen_block_q and meta.varlen_tile_n):
        return None, {}
    cap = (model._graph_sizes or model._token_sizes or (0,))[-1]
    # the grid's KV heads; one for a model pagesim does not know
    kernel = VarlenKernel(meta.varlen_block_q, meta.varlen_tile_n, cap, meta.kv_heads_per_gpu or 1)
    per_bs: dict[int, list] = defaultdict(list)
    for kind, tokens, r in rows:
        shape = row_batch(kind, r)
        if shape is None:
            continue
        padded = model.padded_tokens(tokens)
        step = model._measured_s(r)
        other = model._other_for(padded is not None, padded or tokens)
        per_bs[r.block_size].append((shape, padded, step - other, step))
    kernel, fits = fit_varlen_overhead(kernel, per_bs)
    return (kernel, fits) if fits else (None, {})
