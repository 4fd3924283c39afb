"""The single-prefill bias: what the variable-length fit gets wrong on one long prefill."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_varlen import SLOTS_GRID, _with_varlen

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.corrections.prefill_bias import PrefillBias
from pagesim.cost.profile import Profile
from pagesim.cost.surface import blend_weights
from pagesim.cost.varlen_launch import VarlenFit

TRUTH = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)


def test_the_line_is_recovered_and_held_flat_outside_its_rows() -> None:
    line = PrefillBias.fit([(n, 0.01 - 0.02 * math.log2(n / 1024)) for n in (768, 2048, 8192)])
    assert line.intercept == pytest.approx(0.01) and line.slope == pytest.approx(-0.02)
    assert line(4096) == pytest.approx(0.01 - 0.04)
    assert line(100) == pytest.approx(line(768)) and line(65536) == pytest.approx(line(8192))
    flat = PrefillBias.fit([(2048, 0.01), (2048, 0.03)])
    assert flat.slope == 0.0 and flat(512) == pytest.approx(0.02) == flat(8192)


def _slower(profile: Profile, factor) -> Profile:
    """`profile` with each prefill row `factor(row)` times slower: rows that the fit, which
    also follows the multi-prefill rows, cannot pass through."""
    rows = tuple(
        dataclasses.replace(r, step_time_ms=r.step_time_ms * factor(r)) for r in profile.prefill
    )
    return dataclasses.replace(profile, prefill=rows)


def _without_bias(profile: Profile) -> CalibratedCostModel:
    model = CalibratedCostModel(profile)
    model._prefill_bias = {}  # the same fit, the bias off
    return model


def test_an_exact_fit_has_no_bias(clean_profile) -> None:
    model = CalibratedCostModel(_with_varlen(clean_profile, TRUTH))
    assert model.fits["prefill_bias"]
    for line in model.fits["prefill_bias"].values():
        assert abs(line.intercept) < 1e-6 and abs(line.slope) < 1e-6


def test_one_prefill_steps_take_the_line_through_the_rows_the_fit_misses(clean_profile) -> None:
    def factor(r) -> float:  # long prefills measured slower than the law, as on the H200
        return 1.0 + 0.015 * math.log2(r.num_new_tokens) + 0.01 * (r.num_cached_tokens > 0)

    profile = _slower(_with_varlen(clean_profile, TRUTH), factor)
    model, fit_only = CalibratedCostModel(profile), _without_bias(profile)
    for bs, line in model.fits["prefill_bias"].items():
        rows = [r for r in profile.prefill if r.block_size == bs]
        x = [math.log2(r.num_new_tokens / 1024) for r in rows]
        y = [
            r.step_time_ms
            * 1e-3
            / fit_only.device_time(BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, bs))
            - 1.0
            for r in rows
        ]
        slope, intercept = np.polyfit(x, y, 1)
        assert line.slope == pytest.approx(slope) and line.intercept == pytest.approx(intercept)
        assert line.slope > 0.0  # the fit leaves the longer prefills more to add
    r = profile.prefill[-1]
    factor_r = 1.0 + model.fits["prefill_bias"][r.block_size](r.num_new_tokens)
    # one prefill, alone or beside decodes: the fit's price times the line's factor
    for shape in (
        BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size),
        BatchShape.mixed(r.num_new_tokens, r.num_cached_tokens, 8, 512, r.block_size),
    ):
        assert model.device_time(shape) == pytest.approx(
            fit_only.device_time(shape) * factor_r, rel=1e-9
        )
    # several prefill entries keep the fit alone
    two = BatchShape(
        r.block_size,
        2 * r.num_new_tokens,
        prefill_new_tokens=[r.num_new_tokens] * 2,
        prefill_context_tokens=[r.num_cached_tokens] * 2,
    )
    assert model.device_time(two) == fit_only.device_time(two)


def test_block_sizes_without_rows_blend_the_measured_lines(clean_profile) -> None:
    profile = _slower(
        _with_varlen(clean_profile, TRUTH),
        lambda r: 1.0 + 0.02 * math.log2(r.num_new_tokens) / r.block_size,
    )
    model, fit_only = CalibratedCostModel(profile), _without_bias(profile)
    sizes = sorted(model.fits["prefill_bias"])
    if len(sizes) < 2:
        pytest.skip("the fixture measures prefill rows at one block size")
    mid = sizes[0] + 1  # between two measured block sizes: both weigh in
    weights = blend_weights(model.fits["prefill_bias"], mid)
    assert len(weights) == 2 and all(0.0 < w < 1.0 for w, _ in weights)
    shape = BatchShape.prefill(2048, 0, mid)
    assert model.device_time(shape) == pytest.approx(
        fit_only.device_time(shape) * (1.0 + sum(w * b(2048) for w, b in weights)), rel=1e-9
    )
