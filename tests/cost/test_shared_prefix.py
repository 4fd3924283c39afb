"""Decode steps over shared prefix blocks: the shared-read fraction fitted from decode_shared
rows and the effective context it prices such steps at."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import DecodeSharedRow, Profile

REREAD = 0.3  # the law the synthetic rows follow


def _shared_profile(profile: Profile) -> Profile:
    base = CalibratedCostModel(profile)
    rows = []
    for bs in (8, 16, 32):
        for b, c, s in [(16, 1024, 512), (64, 1024, 896), (64, 2048, 1024), (256, 1024, 896)]:
            ceff = round(c - (1 - REREAD) * s)
            t = base.step_time(BatchShape.decode(b, ceff, bs)) * 1e3
            ref = base.step_time(BatchShape.decode(b, c, bs)) * 1e3
            # rows from "another session" 7 % slower: only the ratio to the reference counts
            rows.append(DecodeSharedRow(bs, b, c, s, 1.07 * t, t, t, 0.0, 0.0, 1.07 * ref))
    return Profile(
        profile.metadata, profile.decode, profile.prefill, profile.mixed, decode_shared=tuple(rows)
    )


@pytest.fixture(scope="module")
def shared_model(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(_shared_profile(clean_profile.replace_tables(overhead=())))


def test_reread_fraction_is_recovered(shared_model, clean_profile) -> None:
    assert shared_model.reread_fraction == {
        8: pytest.approx(REREAD, abs=0.011),
        16: pytest.approx(REREAD, abs=0.011),
        32: pytest.approx(REREAD, abs=0.011),
    }
    assert CalibratedCostModel(clean_profile).reread_fraction == {}


def test_shared_blocks_make_a_decode_step_cheaper(shared_model) -> None:
    n, ctx = 64, 1500
    alone = BatchShape.decode(n, ctx, 16)
    shared = dataclasses.replace(alone, shared_context_tokens=n * 1000)
    private = dataclasses.replace(alone, shared_context_tokens=0)
    assert shared_model.step_time(private) == shared_model.step_time(alone)
    assert shared_model.step_time(shared) < shared_model.step_time(alone)
    frac = shared_model.reread_fraction[16]
    ceff = round(ctx - (1 - frac) * 1000)
    assert shared_model.step_time(shared) == pytest.approx(
        shared_model.step_time(BatchShape.decode(n, ceff, 16)), rel=1e-3
    )


def test_profiles_without_shared_rows_ignore_the_shared_count(clean_profile) -> None:
    model = CalibratedCostModel(clean_profile)
    alone = BatchShape.decode(64, 1500, 16)
    shared = dataclasses.replace(alone, shared_context_tokens=64 * 1000)
    assert model.step_time(shared) == model.step_time(alone)
