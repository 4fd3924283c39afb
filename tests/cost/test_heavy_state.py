"""A heavy step after light ones: the heavy_state factors, how `CalibratedCostModel` prices a
step by the light steps before it, and how the simulator's runner counts them."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.heavy_state import heavy_state_factors, interpolate
from pagesim.cost.profile import HeavyStateRow, Profile
from pagesim.sim.runner import CostModelRunner

# light steps before -> the step's time over its calibration row (the synthetic law)
LAW = {0: 1.02, 1: 0.99, 10: 0.97, 30: 0.96}


def _rows(profile: Profile) -> tuple[HeavyStateRow, ...]:
    cal = {r.num_new_tokens: r.step_time_ms for r in profile.prefill
           if r.block_size == 16 and r.num_cached_tokens == 0}
    return tuple(HeavyStateRow(16, n, k, f * cal[n], LAW[0] * cal[n])
                 for n in (1024, 4096) for k, f in LAW.items())


@pytest.fixture(scope="module")
def plain(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(clean_profile.replace_tables(overhead=()))


@pytest.fixture(scope="module")
def stateful(clean_profile) -> CalibratedCostModel:
    profile = clean_profile.replace_tables(overhead=())
    return CalibratedCostModel(dataclasses.replace(profile, heavy_state=_rows(profile)))


def test_factors_are_the_rows_over_their_calibration_rows(stateful, plain) -> None:
    assert [k for k, _ in stateful.heavy_state] == list(LAW)
    assert [f for _, f in stateful.heavy_state] == pytest.approx(list(LAW.values()))
    assert plain.heavy_state == ()
    # rows whose tokens have no calibration prefill row (nothing cached) are not used
    orphan = dataclasses.replace(stateful.profile, heavy_state=(
        HeavyStateRow(16, 3000, 0, 50.0, 50.0),))
    assert heavy_state_factors(orphan) == ()


def test_interpolate_is_linear_between_points_and_flat_outside() -> None:
    points = ((0, 1.0), (10, 0.9), (30, 0.8))
    assert interpolate(points, 5) == pytest.approx(0.95)
    assert interpolate(points, 20) == pytest.approx(0.85)
    assert interpolate(points, 100) == 0.8 and interpolate(points, -1) == 1.0


def test_a_heavy_step_is_priced_by_the_light_steps_before_it(stateful, plain) -> None:
    heavy = BatchShape.prefill(2048, 0, 16)
    assert stateful.is_heavy(heavy) and not stateful.is_heavy(BatchShape.prefill(256, 0, 16))
    base = stateful.step_time_breakdown(heavy)
    device = base["other"] + base["attention"]
    for k, expected in [(0, 1.02), (10, 0.97), (20, 0.965), (99, 0.96)]:
        assert stateful.step_time_after(heavy, k) == pytest.approx(
            device * expected + stateful.step_time(heavy) - device)
    # the device part alone (what a real run's per-step records compare with)
    assert stateful.device_time(heavy, 10) == pytest.approx(
        stateful.device_time(heavy) + (0.97 - 1.0) * device)
    # light steps, and any step of a profile without the rows, are priced as before
    for shape in (BatchShape.decode(64, 1024, 16), BatchShape.prefill(256, 0, 16)):
        assert stateful.step_time_after(shape, 10) == stateful.step_time(shape)
    assert plain.step_time_after(heavy, 10) == plain.step_time(heavy)


def test_the_runner_counts_light_steps_since_the_last_heavy_one(stateful, plain) -> None:
    runner = CostModelRunner(stateful)
    heavy = BatchShape.prefill(2048, 0, 16)
    light = BatchShape.decode(8, 512, 16)
    times = []
    for shape in (light, light, heavy, heavy, light):
        times.append(runner._priced(dataclasses.replace(shape)))
    assert times[2] == pytest.approx(stateful.step_time_after(heavy, 2))
    assert times[3] == pytest.approx(stateful.step_time_after(heavy, 0))
    assert runner.light_steps_before == 1
    runner.lead_decode_step_time(16, 8, 8 * 512, [512] * 8)  # the decode-only fast path
    assert runner.light_steps_before == 2
    # without heavy_state rows the runner prices as the cost model always did
    assert CostModelRunner(plain)._priced(dataclasses.replace(heavy)) == plain.step_time(heavy)


def test_rows_round_trip(stateful, tmp_path) -> None:
    loaded = Profile.load(stateful.profile.save(tmp_path / "p"))
    assert loaded.heavy_state == stateful.profile.heavy_state
