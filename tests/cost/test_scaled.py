"""`ScaledCostModel`: every step a fixed factor of another model's time; bad factors are one
line, as every bad input is."""

from __future__ import annotations

import math

import pytest

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.cost.scaled import ScaledCostModel, check_step_time_scale
from pagesim.errors import ConfigError
from pagesim.sim.build import build_cost_model, scaled_cost_model


class _Flat:
    reread_fraction = {16: 0.25}

    def step_time(self, batch: BatchShape) -> float:
        return 0.01 * batch.total_tokens


def test_every_step_is_scaled_and_the_shared_read_cost_kept() -> None:
    scaled = ScaledCostModel(_Flat(), 1.25)
    for shape in (BatchShape.decode(8, 100), BatchShape.decode(1, 4000, block_size=32)):
        assert scaled.step_time(shape) == pytest.approx(1.25 * _Flat().step_time(shape))
    assert scaled.reread_fraction == {16: 0.25}


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "fast", None])
def test_a_factor_that_is_not_a_positive_number_is_refused(bad) -> None:
    with pytest.raises(ConfigError, match="--step-time-scale"):
        check_step_time_scale(bad)
    with pytest.raises(ConfigError, match="must be a number > 0"):
        ScaledCostModel(_Flat(), bad)


def test_the_flag_is_bounded_but_a_band_end_past_the_bound_is_priced() -> None:
    assert check_step_time_scale(1e-3) == 1e-3 and check_step_time_scale(1e3) == 1e3
    for bad in (9.99e-4, 1000.5, 1e300, 1e-300):
        with pytest.raises(ConfigError, match=r"must be a number in \[0.001, 1000\]"):
            check_step_time_scale(bad)
    assert ScaledCostModel(_Flat(), 1e3 * 1.05).factor == 1050.0  # the band around 1e3


def test_scale_one_builds_nothing_and_another_wraps_the_model() -> None:
    cfg = EngineConfig.create()
    assert scaled_cost_model(cfg, None, 1.0) is None
    model = scaled_cost_model(cfg, None, 1.03)
    shape = BatchShape.decode(16, 1024)
    assert model.step_time(shape) == pytest.approx(
        1.03 * build_cost_model(cfg, None).step_time(shape)
    )
