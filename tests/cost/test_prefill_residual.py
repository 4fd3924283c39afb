"""The prefill residual: what the variable-length fit leaves on single long prefill rows."""

from __future__ import annotations

import dataclasses

import pytest
from test_varlen import SLOTS_GRID, _with_varlen

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.prefill_residual import PrefillResidual
from pagesim.cost.profile import Profile
from pagesim.cost.surface import blend_weights
from pagesim.cost.varlen import VarlenFit


def test_residual_is_linear_in_log_tokens_and_between_cached_levels() -> None:
    r = PrefillResidual([(1024, 0, 1.0), (4096, 0, 3.0), (1024, 4096, 5.0),
                         (4096, 4096, 7.0), (4096, 4096, 9.0), (4096, 4096, 8.0)])
    assert r(2048, 0) == pytest.approx(2.0)  # halfway in log2(new tokens)
    assert r(2048, 2048) == pytest.approx((2.0 + 6.5) / 2)  # repeats: their median (8)
    assert r(512, 0) == pytest.approx(1.0) and r(8192, 0) == pytest.approx(3.0)  # flat out
    assert r(4096, 8192) == pytest.approx(8.0)


def _slow_single_prefills(profile: Profile, factor: float) -> Profile:
    """`profile` with every prefill row `factor` times slower: rows the fit, which also
    follows the multi-prefill rows, cannot pass through."""
    rows = tuple(dataclasses.replace(r, step_time_ms=r.step_time_ms * factor)
                 for r in profile.prefill)
    return dataclasses.replace(profile, prefill=rows)


def test_a_one_prefill_eager_step_takes_its_rows_residual(clean_profile) -> None:
    truth = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)
    profile = _slow_single_prefills(_with_varlen(clean_profile, truth), 1.06)
    model = CalibratedCostModel(profile)
    fit_only = CalibratedCostModel(profile)
    fit_only._prefill_residual = {}  # the same fit, without the residual
    assert set(model.prefill_residuals) == {r.block_size for r in profile.prefill}
    missed = 0
    for r in profile.prefill:
        shape = BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size)
        assert model.device_time(shape) * 1e3 == pytest.approx(r.step_time_ms, rel=1e-9)
        missed += fit_only.device_time(shape) * 1e3 != pytest.approx(r.step_time_ms, rel=1e-3)
    assert missed  # the fit alone misses rows: the residual is what closes them
    # a one-prefill step with decodes takes the residual of its prefill entry
    r = profile.prefill[-1]
    mixed = BatchShape.mixed(r.num_new_tokens, r.num_cached_tokens, 8, 512, r.block_size)
    alone = BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size)
    assert (model.device_time(mixed) - fit_only.device_time(mixed)) == pytest.approx(
        model.device_time(alone) - fit_only.device_time(alone), rel=1e-9)
    # several prefill entries keep the fit alone
    two = BatchShape(16, 2 * r.num_new_tokens, prefill_new_tokens=[r.num_new_tokens] * 2,
                     prefill_context_tokens=[r.num_cached_tokens] * 2)
    assert model.device_time(two) == fit_only.device_time(two)


def test_block_sizes_without_rows_blend_the_measured_residuals(clean_profile) -> None:
    truth = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)
    model = CalibratedCostModel(_slow_single_prefills(_with_varlen(clean_profile, truth), 1.06))
    sizes = sorted(model.prefill_residuals)
    if len(sizes) < 2:
        pytest.skip("the fixture measures prefill rows at one block size")
    mid = sizes[0] + 1  # between two measured block sizes: both weigh in
    weights = blend_weights(model.prefill_residuals, mid)
    assert len(weights) == 2 and all(0.0 < w < 1.0 for w, _ in weights)
    expected = sum(w * residual(2048, 0) for w, residual in weights)
    fit_only = CalibratedCostModel(model.profile)
    fit_only._prefill_residual = {}
    shape = BatchShape.prefill(2048, 0, mid)
    assert model.device_time(shape) - fit_only.device_time(shape) == pytest.approx(
        expected, rel=1e-6)
