"""The band an answer lies in as the GPU's speed level moves: step-time factors at its ends.

The same step on the same kind of GPU runs a few % faster or slower from one GPU session to
the next; a merged profile records how far each of its source calibrations sat from the merge
(`ProfileMetadata.source_scales`). The band is where the next session's level is expected: a
95 % prediction interval from those levels (mean +- t * sd * sqrt(1 + 1/n), Student's t with
n - 1 degrees of freedom), never narrower than the levels measured. Not their range: the
range of n sessions holds the next one only with probability (n - 1) / (n + 1), 82 % for ten,
and a few calibrations made on one day understate how far sessions move. Pricing every step
at the interval's two ends, and simulating again, gives the range an answer moves in. Queueing
makes that range wider than the interval itself near saturation, which is why the ends are
simulated rather than the answer scaled.

Where a profile records no spread (one calibration), the levels of every merged profile
shipped for the same GPU are pooled into one interval (the level is the session's, not the
model's), or where none ships for that GPU those of the GPU whose profiles pricing carries
(`transfer.SOURCE_GPU`), and the band says so. A GPU priced by transfer of another GPU's profile
(`pagesim.cost.transfer`) widens the source's band by the transfer error measured on that GPU
(`pagesim.cost.transfer_error.band_widening_pct`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pagesim.cost.profile import ProfileMetadata


class StepTimeBand(NamedTuple):
    """Factors on every step time at the band's ends (low <= 1 <= high as measured), and the
    phrase that says where they come from."""

    low: float
    high: float
    basis: str

    def scaled(self, factor: float) -> StepTimeBand:
        """The band around an explicit --step-time-scale what-if."""
        return StepTimeBand(self.low * factor, self.high * factor, self.basis)

    def to_json(self) -> dict[str, float | str]:
        return {"low": self.low, "high": self.high, "basis": self.basis}


#: Student's t at 0.975 (two-sided 95 %) by degrees of freedom 1-30; beyond 30 the last.
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def session_interval(levels: Sequence[float]) -> tuple[float, float]:
    """Where the next session's level lies with 95 % probability, given two or more measured
    levels (see the module docstring), widened to hold every measured level."""
    n = len(levels)
    if n < 2:
        raise ValueError("a prediction interval needs two levels or more")
    mean = statistics.fmean(levels)
    half = _T_975[min(n - 1, len(_T_975)) - 1] * statistics.stdev(levels) * math.sqrt(1 + 1 / n)
    return min(mean - half, *levels), max(mean + half, *levels)


def profile_band(meta: ProfileMetadata) -> StepTimeBand | None:
    """The band of the profile's own measured levels, or None when it records fewer than two."""
    scales = meta.source_scales
    if scales is None or len(scales) < 2:
        return None
    basis = f"a 95 % interval for a session's speed from the profile's {len(scales)} calibrations"
    return StepTimeBand(*session_interval(scales), basis)


def gpu_band(
    metas: Iterable[ProfileMetadata], gpu: str, borrowed_for: str | None = None
) -> StepTimeBand | None:
    """The band of the levels of every one of `metas` (the profiles shipped for `gpu`) pooled,
    for a profile of that GPU that records none, or with `borrowed_for` for a profile of a GPU
    with no merged profile shipped (the session-to-session spread measured on `gpu` is the
    best estimate there is); None when they record fewer than two."""
    levels = [s for meta in metas for s in meta.source_scales or ()]
    if len(levels) < 2:
        return None
    whose = "" if borrowed_for is None else f"; none measured on {borrowed_for}"
    basis = (
        f"a 95 % interval for a session's speed from the {len(levels)} calibrations of the "
        f"merged profiles shipped for {gpu} (this profile is one calibration{whose})"
    )
    return StepTimeBand(*session_interval(levels), basis)


def widened(band: StepTimeBand, pct: float, why: str) -> StepTimeBand:
    """`band` widened by `pct` % each way, for `why`."""
    return StepTimeBand(
        band.low * (1 - pct / 100),
        band.high * (1 + pct / 100),
        f"{band.basis}, widened by {pct:g} % ({why})",
    )


def range_text(center: float, low: float, high: float, digits: int = 2) -> str:
    """`4.53 (4.27-4.71)`: a figure and the range its band gives."""
    return f"{center:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"
