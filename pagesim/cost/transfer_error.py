"""How far the transfer cost model is off on GPUs where others measured the same operations.

The figures are data, `pagesim/data/transfer/errors.csv` (read by
`pagesim.sim.build.transfer_errors`; the cost layer reads no package data), written by
`python benchmarks/transfer_vs_vidur.py` (results/transfer_vs_vidur.csv, docs/other_gpus.md):
the median absolute error, in %, of the transfer model's prediction of each operation that
Vidur (microsoft/vidur) measured on that GPU, per family of operations, over every case (those
used while building the model and those held out). They say how far a transferred GPU's
answers can be trusted (`transfer_note`) and how much wider its band is than the source
profile's (`band_widening_pct`); tests/cost/test_transfer_error.py recomputes them from the
shipped subset of Vidur's tables.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import NamedTuple

from pagesim.errors import PagesimError

ERRORS_FILE = "errors.csv"  # in the shipped data's transfer/ folder (`pagesim.data`)


class TransferError(NamedTuple):
    """Median |error| in % of one GPU's checked operations, per family (None: not checked)."""

    gemm: float
    elementwise: float
    allreduce: float | None
    checked_as: str  # the Vidur GPU whose measurements gave it


def read_errors(path: Path) -> dict[str, TransferError]:
    """GPU name -> its measured transfer error, from a table as the benchmark writes it."""
    out: dict[str, TransferError] = {}
    try:
        with open(path, encoding="utf-8", newline="") as f:
            for row in csv.DictReader(f):
                allreduce = row["allreduce_median_abs_pct"]
                out[row["gpu"]] = TransferError(
                    float(row["gemm_median_abs_pct"]),
                    float(row["elementwise_median_abs_pct"]),
                    float(allreduce) if allreduce else None,
                    f"Vidur's {row['checked_as'].upper()}",
                )
    except (OSError, KeyError, ValueError) as e:
        raise PagesimError(f"{path}: cannot read the transfer errors ({e})") from None
    return out


def band_widening_pct(gpu: str, errors: dict[str, TransferError]) -> tuple[float, str]:
    """How much wider (in %, each way) a band priced by transfer to `gpu` is, and why: the
    median GEMM error measured on that GPU (GEMMs are most of a step's time; element-wise
    kernels, far worse, are 9-16 % of it), else the largest GEMM error measured on any GPU."""
    err = errors.get(gpu)
    if err is not None:
        return err.gemm, f"the transfer's median GEMM error on {err.checked_as}"
    worst = max(errors, key=lambda g: errors[g].gemm)
    return (
        errors[worst].gemm,
        f"the largest median GEMM error the transfer showed ({errors[worst].checked_as}; "
        f"{gpu} unchecked)",
    )


def transfer_note(gpu: str, errors: dict[str, TransferError]) -> str:
    """The clause of the cost-model line that says how far a transferred GPU is trusted."""
    err = errors.get(gpu)
    if err is None:
        return f"transfer error not measured on {gpu} (measured on {', '.join(sorted(errors))})"
    allreduce = "" if err.allreduce is None else f", all-reduce {err.allreduce:.0f} %"
    return (
        f"transfer error per operation on {err.checked_as}: GEMMs {err.gemm:.0f} %, "
        f"element-wise {err.elementwise:.0f} %{allreduce} (median |error|, "
        "docs/other_gpus.md)"
    )
