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
SERVED_FILE = "served.csv"  # the same folder: the end-to-end error on served runs


class TransferError(NamedTuple):
    """Median |error| in % of one GPU's checked operations, per family (None: not checked)."""

    gemm: float
    elementwise: float
    allreduce: float | None
    checked_as: str  # the Vidur GPU whose measurements gave it


class ServedError(NamedTuple):
    """The largest |error| in % of the transfer's mean TPOT against the mean of a load's
    repeats, over the loads served on a GPU (`benchmarks/band_vs_repeats.py --write-served`)."""

    mean_tpot_pct: float
    served_on: str  # the card, as its driver names it
    runs: str  # the folder of the real runs


def read_served(path: Path) -> dict[str, ServedError]:
    """GPU name -> the transfer's end-to-end error where it was served (none: {})."""
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return {
                row["gpu"]: ServedError(float(row["mean_tpot_pct"]), row["served_on"], row["runs"])
                for row in csv.DictReader(f)
            }
    except (OSError, KeyError, ValueError) as e:
        raise PagesimError(f"{path}: cannot read the served transfer errors ({e})") from None


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


def band_widening_pct(
    gpu: str,
    errors: dict[str, TransferError],
    allreduce_share: float = 0.0,
    served: dict[str, ServedError] | None = None,
) -> tuple[float, str]:
    """How much wider (in %, each way) a band priced by transfer to `gpu` is, and why: the
    operations' error (`operation_widening_pct`), or the transfer's end-to-end error where a
    served GPU showed a larger one (`served`; the GPU's own, else the largest on any GPU).
    Operations measured one by one miss what only a whole step shows, so a served run's
    error, when larger, is the one the band must hold."""
    pct, why = operation_widening_pct(gpu, errors, allreduce_share)
    if not served:
        return pct, why
    key = gpu if gpu in served else max(served, key=lambda g: served[g].mean_tpot_pct)
    end_to_end = served[key]
    if end_to_end.mean_tpot_pct <= pct:
        return pct, why
    where = "" if key == gpu else f", {gpu} never served"
    return end_to_end.mean_tpot_pct, (
        f"the transfer's largest mean-TPOT error on loads served on an {end_to_end.served_on}"
        f"{where}; {why}: {pct:g} %"
    )


def operation_widening_pct(
    gpu: str, errors: dict[str, TransferError], allreduce_share: float = 0.0
) -> tuple[float, str]:
    """How much wider (in %, each way) the operations' measured error makes a band priced
    by transfer to `gpu`, and why.

    Without tensor parallelism (`allreduce_share` 0): the median GEMM error measured on that
    GPU (GEMMs are most of a step's time; element-wise kernels, far worse, are 9-16 % of it),
    else the largest GEMM error measured on any GPU.

    With it, a step is its all-reduces plus the rest (taken at the GEMM error, as without
    tensor parallelism). The band is one factor on every step, fixed before the run, so it
    takes the step error where the all-reduces weigh most: the two errors weighted by
    `allreduce_share`, the largest share of a step's time the all-reduces take
    (`TransferCostModel.allreduce_share`). A share-weighted sum because a step's error is its
    parts' errors weighted by their times, and the transfer's all-reduce errs mostly one way,
    so the errors add rather than cancel; not the larger of the two, which would widen every
    step by an error that only a small share of its time carries. The all-reduce error is the
    GPU's own where Vidur measured its all-reduces, else the largest measured on any GPU.
    """
    err = errors.get(gpu)
    if err is not None:
        gemm, gemm_on = err.gemm, err.checked_as
    else:
        worst = max(errors, key=lambda g: errors[g].gemm)
        gemm, gemm_on = errors[worst].gemm, errors[worst].checked_as
    if allreduce_share <= 0.0:
        if err is not None:
            return gemm, f"the transfer's median GEMM error on {gemm_on}"
        return (
            gemm,
            f"the largest median GEMM error the transfer showed ({gemm_on}; {gpu} unchecked)",
        )
    if err is not None and err.allreduce is not None:
        allreduce, allreduce_on = err.allreduce, err.checked_as
    else:
        measured = {g: e.allreduce for g, e in errors.items() if e.allreduce is not None}
        worst = max(measured, key=lambda g: measured[g] or 0.0)
        allreduce, allreduce_on = measured[worst] or 0.0, errors[worst].checked_as
    pct = round((1.0 - allreduce_share) * gemm + allreduce_share * allreduce, 1)
    if err is None:
        what = (
            f"GEMMs {gemm:g} % and all-reduces {allreduce:g} %, the largest median errors the "
            f"transfer showed ({gemm_on}, {allreduce_on}; {gpu} unchecked)"
        )
    elif err.allreduce is None:
        what = (
            f"GEMMs {gemm:g} %, the transfer's median error on {gemm_on}, and all-reduces "
            f"{allreduce:g} %, the largest measured ({allreduce_on}; {gpu}'s unchecked)"
        )
    else:
        what = (
            f"GEMMs {gemm:g} % and all-reduces {allreduce:g} %, the transfer's median errors "
            f"on {gemm_on}"
        )
    return pct, f"{what}, weighted by the all-reduces' largest share of a step, " + (
        f"{100 * allreduce_share:.0f} %"
    )


def band_clause(tensor_parallel_size: int) -> str:
    """The cost-model line's clause that says what a transferred band is widened by."""
    served = ", or by the end-to-end error of served runs where that is larger"
    if tensor_parallel_size > 1:
        return (
            "its band is the source's spread widened by the GEMM and all-reduce errors, "
            f"weighted by the all-reduces' largest share of a step{served}"
        )
    return f"its band is the source's spread widened by the GEMM error{served}"


def transfer_note(gpu: str, errors: dict[str, TransferError]) -> str:
    """The clause of the cost-model line that says how far a transferred GPU is trusted."""
    err = errors.get(gpu)
    if err is None:
        return f"transfer error not measured on {gpu} (measured on {', '.join(sorted(errors))})"
    allreduce = "" if err.allreduce is None else f", all-reduce {err.allreduce:g} %"
    return (
        f"transfer error per operation on {err.checked_as}: GEMMs {err.gemm:g} %, "
        f"element-wise {err.elementwise:g} %{allreduce} (median |error|, "
        "docs/other_gpus.md)"
    )
