"""Correction `drift`: each block size's section of the calibration, taken at one machine state.

Block sizes are calibrated one after another and the GPU's state drifts between them, so the
non-attention time of one step, which cannot depend on the block size, comes out a few % apart
between block sizes, and every step of a slow section would be priced that much dearer. A row's
`other_ms` was timed in the same interleaved rounds as its step, so it measures its section's
drift: every row's step time (and its `other_ms`, in the `other` line) is taken less its
`other_ms` minus the median over block sizes of the same timing; its attention time (step -
other, both timed in its rounds) is kept as measured. Off: rows as measured. Switched off, the
shipped profiles' held-out MAPE falls 0 to 0.43 points: those rows were timed in the drifted
sections it takes out; on served runs' decode steps it took the per-run error from 2.8 to 2.3 %
rms (docs/cost_model.md).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import median
from typing import Any


def other_key(kind: str, r) -> tuple:
    """What a row's `other_ms` was timed for: the calibration times the non-attention part
    once per block size and per decode batch, prefill tokens, (chunk, decodes) or (entries,
    tokens); the rows of one block size that share a key share the value."""
    if kind == "decode":
        return kind, r.batch_size
    if kind == "prefill":
        return kind, r.num_new_tokens
    if kind == "mixed":
        return kind, r.num_new_tokens, r.decode_batch_size
    return kind, r.num_entries, r.num_new_tokens


def section_drift_ms(rows: list[tuple[str, int, Any]], on: bool = True) -> dict[Any, float]:
    """Row -> how far its `other_ms` sits from the median over block sizes of the same timing
    (`other_key`; each block size's own median first), in ms; every row 0.0 when off."""
    if not on:
        return {r: 0.0 for _, _, r in rows}
    timed: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for kind, _, r in rows:
        timed[other_key(kind, r)][r.block_size].append(r.other_ms)
    common = {key: median(median(v) for v in by_bs.values()) for key, by_bs in timed.items()}
    return {r: r.other_ms - common[other_key(kind, r)] for kind, _, r in rows}
