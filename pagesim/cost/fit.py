"""How well a calibrated model predicts steps it was not fitted on.

`fit_report` holds out a seeded fraction of the measured rows of each table, fits a
`CalibratedCostModel` on the rest, and reports the error on the held-out rows: the figure the
README quotes for a shipped profile. `correction_contributions` does it again with each of the
model's corrections off in turn, on the same held-out rows: what each correction is worth.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import MS, CalibratedCostModel
from pagesim.cost.corrections import CORRECTIONS
from pagesim.cost.corrections.reread import shared_spread_shape
from pagesim.cost.profile import Profile
from pagesim.cost.profile_rows import row_batch
from pagesim.errors import ConfigError


@dataclass(frozen=True)
class FitRow:
    """Held-out error of one table (or "all"), in percent of the measured median step time."""

    table: str
    num_fit: int
    num_holdout: int
    mape_pct: float | None  # mean |predicted - measured| / measured; None with no held-out row
    max_abs_pct: float | None
    bias_pct: float | None  # mean signed error: > 0 means the model predicts too slow


@dataclass(frozen=True)
class FitReport:
    holdout_fraction: float
    seed: int
    rows: tuple[FitRow, ...]

    def to_markdown(self) -> str:
        """A table for the README: one line per table plus "all"."""
        lines = [
            "| table | fitted rows | held-out rows | MAPE % | max abs % | bias % |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in self.rows:
            cells = [_pct(v) for v in (r.mape_pct, r.max_abs_pct, r.bias_pct)]
            lines.append(
                f"| {r.table} | {r.num_fit} | {r.num_holdout} | " + " | ".join(cells) + " |"
            )
        return "\n".join(lines)


TABLES_HELD_OUT = (
    "decode",
    "prefill",
    "mixed",
    "multi_prefill",
    "decode_shared",
    "decode_shared_spread",
)


def fit_report(
    profile: Profile,
    holdout_fraction: float = 0.2,
    seed: int = 0,
    disabled_corrections: tuple[str, ...] = (),
) -> FitReport:
    """Fit on part of the measured steps and report the error on the rest.

    Per table and block size, `round(holdout_fraction * rows)` rows drawn with
    `numpy.random.default_rng(seed)` are held out (decode and prefill keep at least two rows
    per block size so a model can be fitted). The model is fitted on the remaining rows of all
    tables and predicts each held-out row's device step time (host overhead excluded, as
    `step_time_ms` excludes it), with `disabled_corrections` off.
    """
    profile, fit_tables, held = _split(profile, holdout_fraction, seed)
    return _report(profile, fit_tables, held, holdout_fraction, seed, disabled_corrections)


def correction_contributions(
    profile: Profile, holdout_fraction: float = 0.2, seed: int = 0
) -> dict[str | None, FitReport]:
    """`fit_report` with every correction on (key None) and with each one off alone (its
    name), all on the same held-out rows."""
    profile, fit_tables, held = _split(profile, holdout_fraction, seed)
    return {
        name: _report(
            profile, fit_tables, held, holdout_fraction, seed, () if name is None else (name,)
        )
        for name in (None, *CORRECTIONS)
    }


def contributions_markdown(reports: dict[str | None, FitReport]) -> str:
    """One line per correction switched off (and one with all on): MAPE % per table and over
    all held-out rows, and how far "all" moves from all on."""
    base = reports[None]
    names = [r.table for r in base.rows]
    lines = [
        "| corrections | " + " | ".join(names) + " | all - all on |",
        "| --- | " + " | ".join("---:" for _ in names) + " | ---: |",
    ]
    ref = base.rows[-1].mape_pct
    for name, report in reports.items():
        cells = [_pct(r.mape_pct) for r in report.rows]
        now = report.rows[-1].mape_pct
        delta = f"{now - ref:+.2f}" if now is not None and ref is not None else "n/a"
        label = "all on" if name is None else f"without {name}"
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {delta} |")
    return "\n".join(lines)


def _split(
    profile: Profile, holdout_fraction: float, seed: int
) -> tuple[Profile, dict[str, tuple], dict[str, list]]:
    """(profile, fitted tables, held-out rows by table) of `fit_report`'s draw."""
    if not 0.0 < holdout_fraction < 1.0:
        raise ConfigError(f"holdout_fraction={holdout_fraction!r}: must be in (0, 1)")
    if not profile.metadata.allreduce_in_step_times:  # compare device rows with device rows
        meta = dataclasses.replace(profile.metadata, allreduce_in_step_times=True)
        profile = dataclasses.replace(profile, metadata=meta)
    rng = np.random.default_rng(seed)
    fit_tables: dict[str, tuple] = {}
    held: dict[str, list] = {}
    for name in TABLES_HELD_OUT:
        rows = getattr(profile, name)
        groups: dict[int, list[int]] = defaultdict(list)
        for i, r in enumerate(rows):
            groups[r.block_size].append(i)
        out: set[int] = set()
        for bs in sorted(groups):
            idx = groups[bs]
            k = int(round(holdout_fraction * len(idx)))
            if name in ("decode", "prefill"):
                k = min(k, len(idx) - 2)
            if k > 0:
                out.update(idx[j] for j in rng.permutation(len(idx))[:k])
        fit_tables[name] = tuple(r for i, r in enumerate(rows) if i not in out)
        held[name] = [r for i, r in enumerate(rows) if i in out]
    return profile, fit_tables, held


def _report(
    profile: Profile,
    fit_tables: dict[str, tuple],
    held: dict[str, list],
    holdout_fraction: float,
    seed: int,
    disabled_corrections: tuple[str, ...],
) -> FitReport:
    model = CalibratedCostModel(
        profile.replace_tables(overhead=(), **fit_tables),
        disabled_corrections=disabled_corrections,
    )
    shapes: dict[str, Callable[[Any], Any]] = {  # a held-out row -> its BatchShape
        "decode": lambda r: BatchShape.decode(r.batch_size, r.context_len, r.block_size),
        "prefill": lambda r: row_batch("prefill", r),
        "mixed": lambda r: row_batch("mixed", r),
        "multi_prefill": lambda r: row_batch("multi", r),
        "decode_shared": lambda r: dataclasses.replace(
            BatchShape.decode(r.batch_size, r.context_len, r.block_size),
            shared_context_tokens=r.batch_size * r.shared_len,
        ),
        "decode_shared_spread": shared_spread_shape,
    }
    report: list[FitRow] = []
    every: list[float] = []
    for name in TABLES_HELD_OUT:
        if not getattr(profile, name):
            continue
        errors = [
            100.0 * (model.step_time(shapes[name](r)) - r.step_time_ms * MS) / (r.step_time_ms * MS)
            for r in held[name]
            if r.step_time_ms > 0
        ]
        every += errors
        report.append(_fit_row(name, len(fit_tables[name]), errors))
    report.append(_fit_row("all", sum(len(t) for t in fit_tables.values()), every))
    return FitReport(holdout_fraction, seed, tuple(report))


def _pct(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "n/a"


def _fit_row(table: str, num_fit: int, errors: list[float]) -> FitRow:
    if not errors:
        return FitRow(table, num_fit, 0, None, None, None)
    e = np.asarray(errors)
    a = np.abs(e)
    return FitRow(
        table, num_fit, len(errors), float(np.mean(a)), float(np.max(a)), float(np.mean(e))
    )
