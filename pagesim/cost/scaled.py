"""A cost model whose every step takes a fixed factor of another model's time.

Calibrations of one setup made in different GPU sessions price the same step a few % apart
(`results/validation/profile_spread_<model>.md`), and near capacity queueing turns a step-time
error into a larger TPOT error (docs/cost_model.md). Pricing every step a little slower than
calibrated (`--step-time-scale 1.03`) plans for a slower session; pricing it 2 % slower and
faster says how far a prediction moves with the GPU's speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.cost.base import BatchShape, CostModel
from pagesim.errors import ConfigError

# What --step-time-scale may be. Sessions differ by a few %, GPU generations by a few times:
# each end is far past any real what-if, so that only a typo or an exponent too many is
# refused, before steps priced 1e-300 or 1e300 times over make the metrics print garbage.
SCALE_RANGE = (1e-3, 1e3)


def check_step_time_scale(factor: float) -> float:
    """`factor` as a float, or a ConfigError naming it: a number in `SCALE_RANGE` (1.0: as
    priced)."""
    low, high = SCALE_RANGE
    try:
        value = float(factor)
    except (TypeError, ValueError):
        value = math.nan  # fails the range check below, as NaN does
    if not low <= value <= high:
        raise ConfigError(f"--step-time-scale {factor!r}: must be a number in [{low:g}, {high:g}]")
    return value


def _positive(factor: float) -> float:
    try:
        value = float(factor)
    except (TypeError, ValueError):
        raise ConfigError(f"--step-time-scale {factor!r}: must be a number > 0") from None
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--step-time-scale {factor!r}: must be a number > 0")
    return value


@dataclass(frozen=True, slots=True)
class ScaledCostModel:
    """`base`'s step times times `factor`: 1.03 prices every step 3 % slower."""

    base: CostModel
    factor: float

    def __post_init__(self) -> None:
        _positive(self.factor)  # not the flag's range: a band's end may lie past it

    @property
    def reread_fraction(self):
        """The base model's shared-prefix read cost, so the simulator still counts the shared
        context tokens it prices (`pagesim.sim.runner.shared_blocks_counter`)."""
        return getattr(self.base, "reread_fraction", None)

    def step_time(self, batch: BatchShape) -> float:
        return self.base.step_time(batch) * self.factor
