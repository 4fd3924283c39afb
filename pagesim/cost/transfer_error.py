"""How far the transfer cost model is off on GPUs where others measured the same operations.

Figures made by `python benchmarks/transfer_vs_vidur.py` (results/transfer_vs_vidur.csv,
docs/other_gpus.md): the median absolute error, in %, of the transfer model's prediction of
each operation that Vidur (microsoft/vidur) measured on that GPU, per family of operations,
over every case (those used while building the model and those held out). They say how far a
transferred GPU's answers can be trusted (`transfer_note`); tests/cost/test_transfer_error.py
recomputes them from the shipped subset of Vidur's tables.
"""

from __future__ import annotations

from typing import NamedTuple


class TransferError(NamedTuple):
    """Median |error| in % of one GPU's checked operations, per family (None: not checked)."""

    gemm: float
    elementwise: float
    allreduce: float | None
    checked_as: str  # the Vidur GPU whose measurements gave it


#: GPU name -> its measured transfer error. Module constant, never mutated at run time.
MEASURED: dict[str, TransferError] = {
    "h100-sxm": TransferError(14.5, 45.8, 10.4, "Vidur's H100"),
    "a100-80gb": TransferError(8.2, 45.0, 27.6, "Vidur's A100"),
    "a40": TransferError(8.9, 34.8, None, "Vidur's A40"),
}


def transfer_note(gpu: str) -> str:
    """The clause of the cost-model line that says how far a transferred GPU is trusted."""
    err = MEASURED.get(gpu)
    if err is None:
        return f"transfer error not measured on {gpu} (measured on {', '.join(sorted(MEASURED))})"
    allreduce = "" if err.allreduce is None else f", all-reduce {err.allreduce:.0f} %"
    return (
        f"transfer error per operation on {err.checked_as}: GEMMs {err.gemm:.0f} %, "
        f"element-wise {err.elementwise:.0f} %{allreduce} (median |error|, "
        "docs/other_gpus.md)"
    )
