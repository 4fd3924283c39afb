"""`pagesim.cost.profile_merge`: each grid point the median of the calibrations that measured
it, and only calibrations of one setup merge."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import median

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile, ProfileError
from pagesim.cost.profile_merge import merge_profiles, source_deviation
from tests.cost.synthetic_profile import make_synthetic_profile

STORED = Path(__file__).resolve().parents[1] / "fixtures" / "validation"


def _with_meta(profile: Profile, **changes) -> Profile:
    return Profile(
        dataclasses.replace(profile.metadata, **changes),
        **{name: getattr(profile, name) for name in ("decode", "prefill", "mixed", "overhead")},
    )


def test_one_profile_merges_into_itself(tmp_path) -> None:
    one = make_synthetic_profile(seed=1)
    merged = merge_profiles([one])
    for table in ("decode", "prefill", "mixed", "overhead"):
        assert getattr(merged, table) == getattr(one, table)
    assert merged.metadata.num_gpu_blocks == one.metadata.num_gpu_blocks
    assert "the median of 1 calibrations" in merged.metadata.notes
    assert all(d == 0 for d in source_deviation(one, merged))


def test_every_column_of_a_point_is_the_median_of_its_sources() -> None:
    sources = [make_synthetic_profile(seed=s) for s in (1, 2, 3)]
    merged = merge_profiles(sources)
    for table in ("decode", "prefill", "mixed", "overhead"):
        rows = [getattr(p, table) for p in sources]
        assert len(getattr(merged, table)) == len(rows[0])
        for got, *measured in zip(getattr(merged, table), *rows, strict=True):
            for f in dataclasses.fields(got):
                values = [getattr(r, f.name) for r in measured]
                assert getattr(got, f.name) == median(values), (table, f.name)
    # a source's deviation is its own row against the median, so the middle one sits at 0
    devs = [source_deviation(p, merged) for p in sources]
    assert all(sorted(d[i] for d in devs)[1] == 0 for i in range(len(devs[0])))


def test_a_point_one_source_lacks_is_the_median_of_those_that_measured_it() -> None:
    a, b, c = (make_synthetic_profile(seed=s) for s in (1, 2, 3))
    c = Profile(c.metadata, c.decode[1:], c.prefill, c.mixed, c.overhead)
    merged = merge_profiles([c, a, b])
    lacked = merged.decode[-1]  # the point c lacks comes after c's own points
    assert (lacked.block_size, lacked.batch_size, lacked.context_len) == (
        a.decode[0].block_size,
        a.decode[0].batch_size,
        a.decode[0].context_len,
    )
    assert lacked.step_time_ms == median([a.decode[0].step_time_ms, b.decode[0].step_time_ms])
    assert len(merged.decode) == len(a.decode)


def test_metadata_blocks_are_the_smallest_scalars_the_median_date_the_newest() -> None:
    a = _with_meta(
        make_synthetic_profile(seed=1),
        date="2026-01-01",
        num_gpu_blocks={16: 90},
        overhead_per_prefill_ms=0.1,
        host_link_bytes_per_s=4e10,
    )
    b = _with_meta(
        make_synthetic_profile(seed=2),
        date="2026-01-03",
        num_gpu_blocks={16: 100, 32: 50},
        overhead_per_prefill_ms=0.3,
    )
    c = _with_meta(
        make_synthetic_profile(seed=3),
        date="2026-01-02",
        num_gpu_blocks={16: 95},
        overhead_per_prefill_ms=None,
        host_link_bytes_per_s=6e10,
    )
    meta = merge_profiles([a, b, c]).metadata
    assert meta.num_gpu_blocks == {16: 90, 32: 50}
    assert meta.overhead_per_prefill_ms == pytest.approx(0.2)
    assert meta.host_link_bytes_per_s == pytest.approx(5e10)
    assert meta.overhead_prefill_step_ms is None
    assert meta.date == "2026-01-03"
    assert "measured 2026-01-01, 2026-01-03, 2026-01-02" in meta.notes


@pytest.mark.parametrize(
    "key,value",
    [
        ("torch", "2.99"),
        ("model", "llama-3-8b"),
        ("dtype", "bfloat16"),
        ("cuda_graph_sizes", [1, 2]),
    ],
)
def test_calibrations_of_another_setup_do_not_merge(key, value) -> None:
    a = make_synthetic_profile(seed=1)
    b = _with_meta(make_synthetic_profile(seed=2), **{key: value})
    with pytest.raises(ProfileError, match=f"profile 1 and profile 2 differ in {key} "):
        merge_profiles([a, b])
    with pytest.raises(ProfileError, match="no profiles"):
        merge_profiles([])


def test_the_merge_is_byte_for_byte_the_same_each_time(tmp_path) -> None:
    sources = [make_synthetic_profile(seed=s) for s in (4, 5)]
    one = merge_profiles(sources).save(tmp_path / "one")
    two = merge_profiles(sources).save(tmp_path / "two")
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in two.iterdir())
    assert all((one / p.name).read_bytes() == (two / p.name).read_bytes() for p in one.iterdir())
    assert Profile.load(one) == merge_profiles(sources)


def test_stored_calibrations_merge_into_a_profile_the_cost_model_prices() -> None:
    calls = ("staged_inputs3", "staged_inputs4", "staged_inputs_calib")
    sources = [Profile.load(STORED / c / "profile" / "h200" / "llama-2-7b") for c in calls]
    merged = merge_profiles(sources)
    # staged_inputs_calib measured block sizes 16 and 32 only: the others' points stay
    assert len(merged.decode) == len(sources[0].decode) > len(sources[2].decode)
    shape = BatchShape.decode(32, 1024, 16)
    prices = [CalibratedCostModel(p).step_time(shape) for p in sources]
    assert min(prices) <= CalibratedCostModel(merged).step_time(shape) <= max(prices)
