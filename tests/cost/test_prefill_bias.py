"""The single-prefill bias: what the variable-length fit gets wrong on one long prefill."""

from __future__ import annotations

import dataclasses
from statistics import median

import pytest
from test_varlen import SLOTS_GRID, _with_varlen

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.cost.surface import blend_weights
from pagesim.cost.varlen import VarlenFit

TRUTH = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)


def _slow_single_prefills(profile: Profile, factors: list[float]) -> Profile:
    """`profile` with its prefill rows slower by `factors` (in turn): rows that the fit,
    which also follows the multi-prefill rows, cannot pass through."""
    rows = tuple(dataclasses.replace(r, step_time_ms=r.step_time_ms * factors[i % len(factors)])
                 for i, r in enumerate(profile.prefill))
    return dataclasses.replace(profile, prefill=rows)


def _without_bias(profile: Profile) -> CalibratedCostModel:
    model = CalibratedCostModel(profile)
    model._prefill_bias = {}  # the same fit, the bias off
    return model


def test_an_exact_fit_has_no_bias(clean_profile) -> None:
    model = CalibratedCostModel(_with_varlen(clean_profile, TRUTH))
    assert model.single_prefill_bias
    assert all(abs(b) < 1e-6 for b in model.single_prefill_bias.values())


def test_the_bias_is_the_median_ratio_of_the_rows_the_fit_misses(clean_profile) -> None:
    profile = _slow_single_prefills(_with_varlen(clean_profile, TRUTH), [1.04, 1.06, 1.09])
    model, fit_only = CalibratedCostModel(profile), _without_bias(profile)
    for bs, bias in model.single_prefill_bias.items():
        ratios = [r.step_time_ms * 1e-3 / fit_only.device_time(BatchShape.prefill(
            r.num_new_tokens, r.num_cached_tokens, bs)) - 1.0
            for r in profile.prefill if r.block_size == bs]
        assert bias == pytest.approx(median(ratios), rel=1e-9)
        assert 0.0 < bias < 0.09
    r = profile.prefill[-1]
    factor = 1.0 + model.single_prefill_bias[r.block_size]
    # one prefill, alone or beside decodes: the fit's price times the factor
    for shape in (BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size),
                  BatchShape.mixed(r.num_new_tokens, r.num_cached_tokens, 8, 512,
                                   r.block_size)):
        assert model.device_time(shape) == pytest.approx(
            fit_only.device_time(shape) * factor, rel=1e-9)
    # several prefill entries keep the fit alone
    two = BatchShape(r.block_size, 2 * r.num_new_tokens,
                     prefill_new_tokens=[r.num_new_tokens] * 2,
                     prefill_context_tokens=[r.num_cached_tokens] * 2)
    assert model.device_time(two) == fit_only.device_time(two)


def test_block_sizes_without_rows_blend_the_measured_biases(clean_profile) -> None:
    profile = _slow_single_prefills(_with_varlen(clean_profile, TRUTH), [1.03, 1.05])
    model, fit_only = CalibratedCostModel(profile), _without_bias(profile)
    sizes = sorted(model.single_prefill_bias)
    if len(sizes) < 2:
        pytest.skip("the fixture measures prefill rows at one block size")
    mid = sizes[0] + 1  # between two measured block sizes: both weigh in
    weights = blend_weights(model.single_prefill_bias, mid)
    assert len(weights) == 2 and all(0.0 < w < 1.0 for w, _ in weights)
    shape = BatchShape.prefill(2048, 0, mid)
    assert model.device_time(shape) == pytest.approx(
        fit_only.device_time(shape) * (1.0 + sum(w * b for w, b in weights)), rel=1e-9)
