"""The calibrated model: exact at grid points, sane between and beyond, fit_report."""

from __future__ import annotations

import dataclasses
import itertools
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synthetic_profile import GPU, MODEL, generating_model

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import (
    BREAKDOWN_KEYS,
    CalibratedCostModel,
    Pwl,
    Surface,
)
from pagesim.cost.fit import FitReport, fit_report
from pagesim.cost.profile import DecodeRow, MixedRow, PrefillRow, Profile, ProfileMetadata
from pagesim.errors import ConfigError

MS = 1e-3


def tiny_profile(decode: list[DecodeRow], prefill: list[PrefillRow]) -> Profile:
    meta = ProfileMetadata(
        gpu="g",
        model="m",
        gpu_name="",
        driver="",
        cuda="",
        torch="",
        triton="",
        dtype="",
        date="",
        synthetic=True,
    )
    return Profile(meta, tuple(decode), tuple(prefill))


@pytest.fixture(scope="module")
def device_model(synthetic_profile) -> CalibratedCostModel:
    """Device time only (no host-overhead table), as the tables measure it."""
    return CalibratedCostModel(synthetic_profile.replace_tables(overhead=()))


def test_reproduces_every_grid_point_of_a_profile_without_drift(clean_profile):
    cm = CalibratedCostModel(clean_profile.replace_tables(overhead=()))
    for r in clean_profile.decode:
        got = cm.step_time(BatchShape.decode(r.batch_size, r.context_len, r.block_size))
        assert got == pytest.approx(r.step_time_ms * MS, rel=1e-9), r
    for r in clean_profile.prefill:
        got = cm.step_time(BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size))
        assert got == pytest.approx(r.step_time_ms * MS, rel=1e-9), r


def test_a_grid_point_is_its_step_less_its_block_sizes_drift(synthetic_profile, device_model):
    """Noisy rows: a decode grid point is priced at its step time less how far its own
    `other_ms` (timed in the same rounds) sits from the median over block sizes."""

    def section(bs: int, batch: int) -> float:  # a block size's other_ms at one batch
        return statistics.median(
            q.other_ms
            for q in synthetic_profile.decode
            if q.block_size == bs and q.batch_size == batch
        )

    for r in synthetic_profile.decode:
        drift = r.other_ms - statistics.median(section(bs, r.batch_size) for bs in (8, 16, 32))
        got = device_model.step_time(BatchShape.decode(r.batch_size, r.context_len, r.block_size))
        assert got == pytest.approx((r.step_time_ms - drift) * MS, rel=1e-9), r


def test_a_block_size_calibrated_in_a_slow_spell_is_priced_as_the_others(clean_profile):
    """Block sizes are calibrated one after another; a spell that slowed one block size's
    whole section (its `other_ms`, which cannot depend on the block size, 6 % above the
    others') must not make that block size's steps dearer."""

    def slow(r):
        extra = 0.06 * r.other_ms
        return (
            dataclasses.replace(r, step_time_ms=r.step_time_ms + extra, other_ms=r.other_ms + extra)
            if r.block_size == 32
            else r
        )

    base = clean_profile.replace_tables(overhead=())
    drifted = base.replace_tables(
        decode=tuple(slow(r) for r in base.decode), prefill=tuple(slow(r) for r in base.prefill)
    )
    cm, cm_drift = CalibratedCostModel(base), CalibratedCostModel(drifted)
    for shape in (
        BatchShape.decode(16, 1000, 32),
        BatchShape.decode(3, 777, 32),
        BatchShape.prefill(500, 1024, 32),
        BatchShape.decode(64, 300, 16),
    ):
        assert cm_drift.step_time(shape) == pytest.approx(cm.step_time(shape), rel=1e-9)


def test_host_overhead_table_is_added_per_step(synthetic_profile, device_model):
    full = CalibratedCostModel(synthetic_profile)
    r = next(r for r in synthetic_profile.decode if r.batch_size == 16)
    host = next(o for o in synthetic_profile.overhead if o.num_reqs == 16).overhead_ms * MS
    shape = BatchShape.decode(16, r.context_len, r.block_size)
    assert full.step_time(shape) == pytest.approx(device_model.step_time(shape) + host, rel=1e-9)
    bd = full.step_time_breakdown(shape)
    assert tuple(bd) == BREAKDOWN_KEYS and bd["host_overhead"] == pytest.approx(host)
    assert sum(bd.values()) == pytest.approx(full.step_time(shape), rel=1e-12)


def test_a_step_admitting_prompts_adds_its_measured_host_time(synthetic_profile):
    plain = CalibratedCostModel(synthetic_profile)
    meta = dataclasses.replace(
        synthetic_profile.metadata, overhead_prefill_step_ms=0.2, overhead_per_prefill_ms=0.15
    )
    admitting = CalibratedCostModel(
        Profile(
            meta,
            synthetic_profile.decode,
            synthetic_profile.prefill,
            synthetic_profile.mixed,
            synthetic_profile.overhead,
        )
    )
    mixed = BatchShape(16, 3 + 300, 3, 3000, [1000] * 3, [100, 200], [0, 512])
    host = (
        plain.step_time_breakdown(mixed)["host_overhead"],
        admitting.step_time_breakdown(mixed)["host_overhead"],
    )
    assert host[1] - host[0] == pytest.approx((0.2 + 2 * 0.15) * MS)
    assert admitting.step_time(mixed) - plain.step_time(mixed) == pytest.approx(0.5 * MS)
    decode = BatchShape.decode(16, 1000, 16)  # no prompt admitted: the table alone
    assert admitting.step_time(decode) == plain.step_time(decode)


def test_interpolates_between_grid_points(clean_profile):
    cm = CalibratedCostModel(clean_profile)
    # context 128 -> 1024 at batch 16, block 16: strictly between the measured ends
    lo, hi = cm.decode_time(16, 128), cm.decode_time(16, 1024)
    mids = [cm.decode_time(16, c) for c in (200, 500, 900)]
    assert lo < mids[0] < mids[1] < mids[2] < hi
    # batch 16 -> 64 at context 1024
    assert cm.decode_time(16, 1024) < cm.decode_time(40, 1024) < cm.decode_time(64, 1024)
    # new tokens 256 -> 1024 at cached 512
    assert cm.prefill_time(256, 512) < cm.prefill_time(600, 512) < cm.prefill_time(1024, 512)


def test_tracks_the_generating_model_off_grid(clean_profile):
    """The noise-free synthetic grid comes from the analytical model: off-grid predictions
    stay within 12 % of it (the error is the piecewise-linear `other` across the GEMM
    roofline knee between 64 and 256 tokens, where the grid has no point)."""
    cm = CalibratedCostModel(clean_profile.replace_tables(overhead=()))
    truth = generating_model()

    def device(shape):
        bd = truth.step_time_breakdown(shape)
        return bd["linear"] + bd["attention"] + bd["paged_blocks"]

    shapes = [
        BatchShape.decode(b, c, bs)
        for b, c, bs in itertools.product(
            (2, 8, 24, 100, 200), (40, 300, 2000, 3000), (8, 12, 16, 32)
        )
        if b * c <= 256 * 1024
    ]
    shapes += [
        BatchShape.prefill(n, c, bs)
        for n, c, bs in itertools.product((20, 100, 700, 3000), (100, 1500, 3000), (8, 16))
    ]
    shapes += [BatchShape.mixed(512, 512, b, 512, 16) for b in (8, 32, 64)]
    errors = [abs(cm.step_time(s) - device(s)) / device(s) for s in shapes]
    assert max(errors) < 0.12
    assert sum(errors) / len(errors) < 0.02


def test_extrapolates_linearly_and_upwards_beyond_the_grid(clean_profile):
    cm = CalibratedCostModel(clean_profile)
    # contexts past 4096: equal steps add equal time (linear), and time grows
    t = [cm.decode_time(16, c) for c in (8192, 16384, 24576)]
    assert t[0] < t[1] < t[2]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
    # batch past 256 and prompts past 4096 tokens never get cheaper
    assert cm.decode_time(1024, 1024) > cm.decode_time(256, 1024)
    assert cm.prefill_time(16384, 0) > cm.prefill_time(4096, 0)


def test_block_size_exact_between_and_nearest_outside(clean_profile):
    cm = CalibratedCostModel(clean_profile)
    t8, t12, t16 = (cm.decode_time(64, 2000, block_size=b) for b in (8, 12, 16))
    assert t8 > t12 > t16  # the synthetic kernel is slower with smaller blocks
    assert cm.decode_time(64, 2000, block_size=4) == cm.decode_time(64, 2000, block_size=8)
    assert cm.decode_time(64, 2000, block_size=128) == cm.decode_time(64, 2000, block_size=32)


def test_mixed_steps_share_the_fixed_cost_checked_against_mixed_table(synthetic_profile):
    cm = CalibratedCostModel(synthetic_profile.replace_tables(overhead=()))
    assert cm.fits["multi_part"][False] >= 0.0
    for r in synthetic_profile.mixed:
        got = cm.step_time(
            BatchShape.mixed(
                r.num_new_tokens,
                r.num_cached_tokens,
                r.decode_batch_size,
                r.decode_context_len,
                r.block_size,
            )
        )
        assert got == pytest.approx(r.step_time_ms * MS, rel=0.08), r  # noise is 2 % (1 sd)


def test_shared_cost_is_removed_once_per_extra_part():
    # two prefill parts of 1 ms residual each, a 0.4 ms shared cost fitted from no mixed rows
    # (the smallest residual) -> 2 * residual - shared
    rows = [PrefillRow(16, n, c, 2.0, 2.0, 2.0, 1.0, 1.0) for n in (10, 20) for c in (0, 50)]
    dec = [DecodeRow(16, b, c, 1.4, 1.4, 1.4, 0.4, 1.0) for b in (1, 2) for c in (10, 20)]
    cm = CalibratedCostModel(tiny_profile(dec, rows))
    assert cm.fits["multi_part"][False] == pytest.approx(0.4 * MS)
    two = BatchShape(16, 30, prefill_new_tokens=[10, 20], prefill_context_tokens=[0, 0])
    assert cm.step_time(two) == pytest.approx((1.0 + 1.0 + 1.0 - 0.4) * MS)


def test_shared_cost_is_fitted_on_the_mixed_table():
    # other = 1 ms everywhere, decode residual 0.4 ms, prefill residual 1.0 ms, and the mixed
    # steps measure 0.3 ms less than the sum of their parts
    dec = [DecodeRow(16, b, c, 1.4, 1.4, 1.4, 0.4, 1.0) for b in (1, 2) for c in (10, 20)]
    pre = [PrefillRow(16, n, c, 2.0, 2.0, 2.0, 1.0, 1.0) for n in (10, 20) for c in (0, 50)]
    mixed = [MixedRow(16, 10, 0, b, 10, 2.1, 2.1, 2.1, 1.1, 1.0) for b in (1, 2)]
    cm = CalibratedCostModel(tiny_profile(dec, pre).replace_tables(mixed=tuple(mixed)))
    assert cm.fits["multi_part"][False] == pytest.approx(0.3 * MS)
    assert cm.step_time(BatchShape.mixed(20, 50, 2, 20)) == pytest.approx(2.1 * MS)


@settings(max_examples=60, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.integers(1, 40000), st.integers(0, 200000)), min_size=0, max_size=6
    ),
    decode=st.lists(st.integers(1, 200000), max_size=300),
    block_size=st.sampled_from([1, 8, 12, 16, 64, 256]),
)
def test_never_negative_anywhere(synthetic_profile, pairs, decode, block_size):
    cm = CalibratedCostModel(synthetic_profile)
    shape = BatchShape(
        block_size,
        len(decode) + sum(n for n, _ in pairs),
        len(decode),
        sum(decode),
        decode,
        [n for n, _ in pairs],
        [c for _, c in pairs],
    )
    assert cm.step_time(shape) >= 0.0


def test_never_negative_on_a_profile_that_slopes_down():
    # times that fall with context: extrapolation must clamp, not go below zero
    dec = [DecodeRow(16, 1, c, t, t, t, t / 2, t / 2) for c, t in ((1, 5.0), (100, 1.0))]
    pre = [PrefillRow(16, n, 0, t, t, t, t / 2, t / 2) for n, t in ((1, 5.0), (100, 1.0))]
    cm = CalibratedCostModel(tiny_profile(dec, pre))
    for shape in (
        BatchShape.decode(1, 10**6),
        BatchShape.prefill(10**5, 10**6),
        BatchShape.mixed(10**4, 0, 500, 10**5),
    ):
        assert cm.step_time(shape) >= 0.0


def test_swap_and_copy_need_a_rate(synthetic_profile):
    shape = BatchShape.decode(4, 100)
    shape.swap_bytes = 10**8
    with pytest.raises(ConfigError, match="swap_bytes"):
        CalibratedCostModel(synthetic_profile).step_time(shape)
    priced = CalibratedCostModel(synthetic_profile, gpu=GPU)
    assert priced.step_time_breakdown(shape)["swap"] == pytest.approx(1e8 / (64e9 * 0.8))
    meta = dataclasses.replace(synthetic_profile.metadata, host_link_bytes_per_s=5e10)
    measured = Profile(meta, synthetic_profile.decode, synthetic_profile.prefill)
    assert CalibratedCostModel(measured, gpu=GPU).step_time_breakdown(shape)[
        "swap"
    ] == pytest.approx(1e8 / 5e10)  # the measured rate wins over the datasheet
    copy = BatchShape.decode(4, 100)
    copy.num_blocks_to_copy = 2
    with pytest.raises(ConfigError, match="num_blocks_to_copy"):
        CalibratedCostModel(synthetic_profile).step_time(copy)
    assert CalibratedCostModel(synthetic_profile, MODEL, GPU).step_time_breakdown(copy)["copy"] > 0


def test_wrong_model_or_gpu_is_refused(synthetic_profile, llama7b, h200):
    with pytest.raises(ConfigError, match="model='other'"):
        CalibratedCostModel(synthetic_profile, model=dataclasses.replace(llama7b, name="other"))
    with pytest.raises(ConfigError, match="gpu='a100'"):
        CalibratedCostModel(synthetic_profile, gpu=dataclasses.replace(h200, name="a100"))


def test_pwl_and_surface_edges():
    f = Pwl({0: [1.0], 10: [3.0], 20: [2.0]})
    assert (f(-5), f(5), f(15), f(30)) == (1.0, 2.0, 2.5, 2.0)  # falling tail held flat
    g = Pwl({1: [1.0, 3.0, 2.0]})
    assert (g(0), g(100)) == (2.0, 2.0)  # median of repeats, constant
    # an exactly bilinear decode surface is recovered everywhere, also off a ragged grid
    pts = [
        (b, c, 0.1 + 0.01 * b + 0.001 * b * c)
        for b in (1, 4, 16)
        for c in (10, 100, 1000)
        if b * c < 16000
    ]
    s = Surface(pts, prefill=False)
    for b, c in ((2, 50), (16, 1000), (64, 5000), (1, 3)):
        assert s(b, c) == pytest.approx(0.1 + 0.01 * b + 0.001 * b * c, rel=1e-9)


# ---- fit_report ----
def test_fit_report_on_the_synthetic_fixture(synthetic_profile):
    rep = fit_report(synthetic_profile, holdout_fraction=0.2, seed=0)
    assert isinstance(rep, FitReport)
    assert [r.table for r in rep.rows] == ["decode", "prefill", "mixed", "all"]
    n_rows = (
        len(synthetic_profile.decode)
        + len(synthetic_profile.prefill)
        + len(synthetic_profile.mixed)
    )
    assert rep.rows[-1].num_fit + rep.rows[-1].num_holdout == n_rows
    assert sum(r.num_holdout for r in rep.rows[:3]) == rep.rows[-1].num_holdout > 0
    for r in rep.rows:
        # the fixture carries 2 % noise: held-out error cannot be zero, nor far above it
        assert 0.3 < r.mape_pct < 8.0 and r.max_abs_pct >= r.mape_pct
    md = rep.to_markdown()
    assert md.startswith("| table |") and md.count("\n") == 5


def test_fit_report_is_deterministic_per_seed(synthetic_profile):
    a = fit_report(synthetic_profile, 0.25, seed=3)
    assert a == fit_report(synthetic_profile, 0.25, seed=3)
    assert a != fit_report(synthetic_profile, 0.25, seed=4)


def test_fit_report_is_near_exact_on_noise_free_bilinear_decode(clean_profile):
    # the synthetic decode attention is bilinear in (batch, context), so the backbone is exact;
    # what is left is the 10 ns rounding of the fixture (measured: 0.07 % at seed 1)
    assert fit_report(clean_profile, 0.3, seed=1).rows[0].max_abs_pct < 0.2


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_fit_report_rejects_bad_fraction(synthetic_profile, fraction):
    with pytest.raises(ConfigError, match="holdout_fraction"):
        fit_report(synthetic_profile, fraction)
