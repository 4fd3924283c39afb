"""The band an answer lies in as the GPU's speed level moves: step-time factors at its ends.

The same step on the same kind of GPU runs a few % faster or slower from one GPU session to
the next; a merged profile records how far each of its source calibrations sat from the merge
(`ProfileMetadata.source_scales`). Pricing every step at the smallest and at the largest of
those levels, and simulating again, gives the range an answer moves in across the measured
spread. Queueing makes that range wider than the spread itself near saturation, which is why
the ends are simulated rather than the answer scaled.

Where a profile records no spread (one calibration), the widest spread of the merged profiles
shipped for the same GPU stands for it, and says so. A GPU priced by transfer of another GPU's
profile (`pagesim.cost.transfer`) widens the source's band by the transfer error measured on
that GPU (`pagesim.cost.transfer_error.band_widening_pct`).
"""

from __future__ import annotations

from collections.abc import Iterable
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


def profile_band(meta: ProfileMetadata) -> StepTimeBand | None:
    """The profile's own measured spread, or None when it records none."""
    scales = meta.source_scales
    if not scales:
        return None
    return StepTimeBand(
        min(scales), max(scales), f"the profile's measured spread ({len(scales)} calibrations)"
    )


def gpu_band(metas: Iterable[ProfileMetadata], gpu: str) -> StepTimeBand | None:
    """The widest spread recorded by any of `metas` (the profiles shipped for `gpu`), for a
    profile of that GPU that records none; None when no profile records one."""
    bands = [b for b in map(profile_band, metas) if b is not None]
    if not bands:
        return None
    return StepTimeBand(
        min(b.low for b in bands),
        max(b.high for b in bands),
        f"the widest spread of the merged profiles shipped for {gpu} (this profile is one "
        "calibration)",
    )


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
