"""Steps with prefill entries in a profile with mixed CUDA graphs (format 4): priced at the
padded token count on the graph line, eager steps on their own line, and the shared cost of
several parts fitted from multi-prefill rows."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import MultiPrefillRow, Profile, ProfileError

DECODE_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256]
TOKEN_SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512]
EAGER_MS = 10.0  # launch cost an eager step carries and a graph replay does not


def _eager_row(row, eager: bool):
    if not eager:
        return row
    return dataclasses.replace(
        row,
        step_time_ms=row.step_time_ms + EAGER_MS,
        step_time_p10_ms=row.step_time_p10_ms + EAGER_MS,
        step_time_p90_ms=row.step_time_p90_ms + EAGER_MS,
        other_ms=row.other_ms + EAGER_MS,
    )


def mixed_graph_profile(profile: Profile, multi: tuple = (), with_mixed: bool = True) -> Profile:
    """The clean profile as a runner with decode and mixed graphs would have measured it:
    rows above the largest size ran eagerly and carry EAGER_MS more `other`."""
    top = TOKEN_SIZES[-1]
    meta = dataclasses.replace(
        profile.metadata, cuda_graph_sizes=DECODE_SIZES, cuda_graph_token_sizes=TOKEN_SIZES
    )
    decode = tuple(_eager_row(r, r.batch_size > DECODE_SIZES[-1]) for r in profile.decode)
    prefill = tuple(_eager_row(r, r.num_new_tokens > top) for r in profile.prefill)
    mixed = tuple(
        _eager_row(r, r.num_new_tokens + r.decode_batch_size > top)
        for r in profile.mixed
        if with_mixed
    )
    return Profile(meta, decode, prefill, mixed, (), (), multi)


@pytest.fixture(scope="module")
def graphs(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(mixed_graph_profile(clean_profile))


def _other(model: CalibratedCostModel, shape: BatchShape) -> float:
    return model.step_time_breakdown(shape)["other"]


def test_padded_tokens_is_the_next_size_or_none(graphs, clean_profile):
    assert [graphs.padded_tokens(t) for t in (1, 3, 17, 65, 300, 512, 513)] == [
        1,
        4,
        24,
        128,
        512,
        512,
        None,
    ]
    assert CalibratedCostModel(clean_profile).padded_tokens(17) is None  # no mixed graphs


def test_graph_steps_cost_their_padded_tokens_and_reproduce_graph_rows(graphs, clean_profile):
    # a 100-token prefill runs the 128-token graph: its `other` is the 128-token row's
    assert _other(graphs, BatchShape.prefill(100)) == pytest.approx(
        _other(graphs, BatchShape.prefill(128)), rel=1e-12
    )
    for r in mixed_graph_profile(clean_profile).prefill:
        if r.block_size == 16 and r.num_new_tokens <= TOKEN_SIZES[-1]:
            got = graphs.prefill_time(r.num_new_tokens, r.num_cached_tokens, 16)
            assert got * 1e3 == pytest.approx(r.step_time_ms, rel=1e-9)


def test_eager_steps_are_priced_on_the_eager_line(graphs, clean_profile):
    rows = [
        r
        for r in mixed_graph_profile(clean_profile).prefill
        if r.block_size == 16 and r.num_new_tokens > TOKEN_SIZES[-1]
    ]
    assert rows
    for r in rows:  # eager rows are reproduced, launch cost included
        got = graphs.prefill_time(r.num_new_tokens, r.num_cached_tokens, 16)
        assert got * 1e3 == pytest.approx(r.step_time_ms, rel=1e-9)
    # just past the largest graph: eager, so it carries the launch cost a graph step does not
    assert (
        _other(graphs, BatchShape.prefill(600))
        > _other(graphs, BatchShape.prefill(512)) + 0.5 * EAGER_MS * 1e-3
    )


def test_one_line_merges_both_modes_without_token_sizes(clean_profile):
    old = mixed_graph_profile(clean_profile)
    old = Profile(
        dataclasses.replace(old.metadata, cuda_graph_token_sizes=[]),
        old.decode,
        old.prefill,
        old.mixed,
    )
    model = CalibratedCostModel(old)
    assert model.padded_tokens(100) is None
    # the 256-token row (graph) and the 1024-token row (eager) share one line
    assert _other(model, BatchShape.prefill(600)) < _other(model, BatchShape.prefill(1024))


def test_shared_cost_is_fitted_from_multi_prefill_rows(clean_profile):
    base = CalibratedCostModel(mixed_graph_profile(clean_profile, with_mixed=False))
    shared_ms = 0.002  # each extra entry costs its residual less this (below the floor)
    multi = []
    for k, n in ((2, 32), (4, 32), (8, 16), (2, 128)):
        shape = BatchShape(16, k * n, prefill_new_tokens=[n] * k, prefill_context_tokens=[0] * k)
        # sum of parts with no shared cost, from a model whose shared cost is zeroed
        total = base.step_time(shape) + (k - 1) * base.fits["multi_part"][True]
        step = total * 1e3 - (k - 1) * shared_ms
        multi.append(MultiPrefillRow(16, k, n, 0, step, step, step, 0.0, _other(base, shape) * 1e3))
    model = CalibratedCostModel(mixed_graph_profile(clean_profile, tuple(multi), False))
    assert model.fits["multi_part"][True] == pytest.approx(shared_ms * 1e-3, rel=0.05)
    for r in multi:  # the multi rows are then reproduced
        shape = BatchShape(
            16,
            r.num_entries * r.num_new_tokens,
            prefill_new_tokens=[r.num_new_tokens] * r.num_entries,
            prefill_context_tokens=[0] * r.num_entries,
        )
        assert model.step_time(shape) * 1e3 == pytest.approx(r.step_time_ms, rel=0.02)


def test_token_sizes_round_trip(tmp_path, clean_profile):
    multi = (MultiPrefillRow(16, 4, 64, 0, 5.0, 4.9, 5.2, 1.0, 4.0),)
    path = mixed_graph_profile(clean_profile, multi).save(tmp_path / "v4")
    loaded = Profile.load(path)
    assert loaded.metadata.cuda_graph_token_sizes == TOKEN_SIZES
    assert loaded.multi_prefill == multi
    (path / "multi_prefill.csv").write_text(
        "block_size,num_entries,num_new_tokens,num_cached_tokens,step_time_ms,"
        "step_time_p10_ms,step_time_p90_ms,attention_ms,other_ms\n16,0,64,0,1,1,1,1,1\n"
    )
    with pytest.raises(ProfileError, match="multi_prefill.csv row 1: num_entries=0"):
        Profile.load(path)
