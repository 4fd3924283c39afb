"""How far the transfer cost model is off on GPUs where others measured the same operations.

Figures made by `python benchmarks/transfer_vs_vidur.py` (results/transfer_vs_vidur.csv,
docs/other_gpus.md): the median absolute error, in %, of the transfer model's prediction of
each operation that Vidur (microsoft/vidur) measured on that GPU, per family of operations.
They widen what a transferred GPU's answers can be trusted to (`transfer_note`).
tests/cost/test_transfer_error.py recomputes them from the shipped subset of Vidur's tables.
"""

from __future__ import annotations

from typing import NamedTuple


class TransferError(NamedTuple):
    """Median |error| in % of one GPU's checked operations, per family."""

    gemm: float
    elementwise: float
    checked_as: str  # the Vidur GPU whose measurements gave it


#: GPU name -> its measured transfer error. Module constant, never mutated at run time.
MEASURED: dict[str, TransferError] = {}


def transfer_note(gpu: str) -> str:
    """The clause of the cost-model line that says how far a transferred GPU is trusted."""
    err = MEASURED.get(gpu)
    if err is None:
        checked = ", ".join(sorted(MEASURED)) or "none"
        return f"transfer error not measured on {gpu} (checked: {checked})"
    return (
        f"transfer error on {err.checked_as} (Vidur's per-operation times): GEMMs "
        f"{err.gemm:.0f} %, element-wise {err.elementwise:.0f} % (median |error|)"
    )
