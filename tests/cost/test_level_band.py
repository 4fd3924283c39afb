"""A profile's measured spread: recorded by the merge, saved as an optional key, and turned
into the step-time band that run and plan price at (`pagesim.cost.level_band`)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pagesim.cost.level_band import (
    StepTimeBand,
    gpu_band,
    profile_band,
    session_interval,
    widened,
)
from pagesim.cost.profile import Profile, ProfileError
from pagesim.cost.profile_merge import merge_profiles, source_scale
from pagesim.data import calibration_dir
from tests.cost.synthetic_profile import make_synthetic_profile


def _slower(profile: Profile, factor: float) -> Profile:
    """The same calibration measured in a session `factor` times slower on every step."""
    tables = {}
    for name in ("decode", "prefill", "mixed"):
        tables[name] = tuple(
            dataclasses.replace(r, step_time_ms=r.step_time_ms * factor)
            for r in getattr(profile, name)
        )
    return profile.replace_tables(**tables)


def test_the_merge_records_each_sources_level_against_it() -> None:
    base = make_synthetic_profile(seed=1)
    sources = [base, _slower(base, 1.04), _slower(base, 0.97)]
    merged = merge_profiles(sources)
    # the median of (0.97, 1, 1.04) is the base itself: the levels are the factors
    assert merged.metadata.source_scales == pytest.approx([1.0, 1.04, 0.97], abs=1e-6)
    assert source_scale(sources[1], merged) == pytest.approx(1.04)
    band = profile_band(merged.metadata)
    assert band is not None
    assert (band.low, band.high) == pytest.approx(session_interval([1.0, 1.04, 0.97]), abs=1e-6)
    assert "3 calibrations" in band.basis


def test_the_band_is_a_95_percent_prediction_interval_for_the_next_session() -> None:
    # mean 1, sd 0.0158; t(4 df) = 2.776; sqrt(1 + 1/5): +- 0.0481
    low, high = session_interval([0.98, 1.00, 1.02, 0.99, 1.01])
    assert (low, high) == pytest.approx((0.95192, 1.04808), abs=1e-5)
    # never narrower than the levels measured (an outlier among many tight ones)
    levels = [1.0] * 29 + [1.001] * 29 + [1.2]
    assert session_interval(levels)[1] == 1.2
    with pytest.raises(ValueError):
        session_interval([1.0])


def test_points_one_session_measured_alone_are_merged_at_the_common_level() -> None:
    """A session that measured a larger grid than the others: its level is read where the
    sessions overlap (its extra points, their own medians, would pull it toward 1), and its
    extra points enter the merge at the level of the rest (divided by its level), so that
    points measured by different sessions compare at one level."""
    base = make_synthetic_profile(seed=1)
    slow = _slower(base, 1.04)

    def bigger(rows, k):
        return tuple(dataclasses.replace(r, batch_size=r.batch_size + 1000 * k) for r in rows)

    # the slow session measured the decode grid at three more sets of batch sizes
    slow = slow.replace_tables(
        decode=slow.decode + sum((bigger(slow.decode, k) for k in (1, 2, 3)), ())
    )
    merged = merge_profiles([base, slow, _slower(base, 0.97)])
    assert merged.metadata.source_scales == pytest.approx([1.0, 1.04, 0.97], abs=1e-6)
    n = len(base.decode)
    for k in (1, 2, 3):
        assert [r.step_time_ms for r in merged.decode[k * n : (k + 1) * n]] == pytest.approx(
            [r.step_time_ms for r in bigger(base.decode, k)]
        )


def test_the_spread_is_an_optional_key_and_round_trips(tmp_path) -> None:
    one = make_synthetic_profile(seed=2)
    one.save(tmp_path / "one")
    assert "source_scales" not in json.loads((tmp_path / "one" / "profile.json").read_text())
    assert profile_band(Profile.load(tmp_path / "one").metadata) is None
    merged = merge_profiles([one, _slower(one, 1.1)])
    merged.save(tmp_path / "merged")
    assert Profile.load(tmp_path / "merged") == merged
    assert json.loads((tmp_path / "merged" / "profile.json").read_text())["source_scales"]


@pytest.mark.parametrize("bad", [[], [0.0], [1.0, -1.0], ["x"], [True], 1.0])
def test_a_bad_spread_is_one_line(tmp_path, bad) -> None:
    path = make_synthetic_profile(seed=3).save(tmp_path / "p")
    meta = json.loads((path / "profile.json").read_text())
    meta["source_scales"] = bad
    (path / "profile.json").write_text(json.dumps(meta))
    with pytest.raises(ProfileError, match="source_scales"):
        Profile.load(path)


def test_shipped_merged_profiles_carry_one_level_per_source() -> None:
    merged = 0
    for meta in (Profile.load_metadata(d) for d in sorted((calibration_dir() / "h200").iterdir())):
        if meta.notes.startswith("the median of "):
            count = int(meta.notes.split()[3])
            assert meta.source_scales is not None and len(meta.source_scales) == count
            assert min(meta.source_scales) < 1 < max(meta.source_scales)
            merged += 1
        else:
            assert meta.source_scales is None
    assert merged >= 3


def test_a_profile_without_spread_takes_the_gpus_pooled_levels_and_transfer_widens() -> None:
    metas = [
        dataclasses.replace(make_synthetic_profile(seed=1).metadata, source_scales=s)
        for s in ([0.98, 1.01], [0.95, 1.0, 1.02], None)
    ]
    band = gpu_band(metas, "h200")
    assert band is not None
    assert (band.low, band.high) == session_interval([0.98, 1.01, 0.95, 1.0, 1.02])
    assert "h200" in band.basis and "5 calibrations" in band.basis
    assert gpu_band(metas[2:], "h200") is None
    band = StepTimeBand(0.95, 1.02, "measured")
    wide = widened(band, 10.0, "why")
    assert (wide.low, wide.high) == pytest.approx((0.855, 1.122))
    assert wide.scaled(2.0).high == pytest.approx(2.244)


def test_a_gpu_with_no_merged_profile_borrows_the_source_gpus_levels() -> None:
    # a user's own calibration on an A100 (one calibration; no merged A100 profile ships)
    from pagesim.sim.build import _shipped_metadata, session_band

    meta = dataclasses.replace(
        make_synthetic_profile(seed=1).metadata, gpu="a100-80gb", source_scales=None
    )
    band = session_band(meta)
    h200 = gpu_band(_shipped_metadata("h200"), "h200")
    assert band is not None and h200 is not None
    assert (band.low, band.high) == (h200.low, h200.high)
    assert "none measured on a100-80gb" in band.basis
    assert "none measured" not in h200.basis
