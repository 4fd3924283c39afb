"""Decode-only steps of a CUDA-graph profile are priced at the padded (captured) batch size;
eager profiles, and version-2 files without `cuda_graph_sizes`, price the true batch."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile, ProfileError

SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256]


def graph_profile(profile: Profile, sizes=SIZES) -> Profile:
    meta = dataclasses.replace(profile.metadata, cuda_graph_sizes=list(sizes))
    return Profile(meta, profile.decode, profile.prefill, profile.mixed, ())


@pytest.fixture(scope="module")
def eager(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(clean_profile.replace_tables(overhead=()))


@pytest.fixture(scope="module")
def graphs(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(graph_profile(clean_profile))


def test_padded_batch_is_the_next_captured_size(graphs, eager):
    assert [graphs.padded_batch(n) for n in (1, 3, 5, 9, 16, 17, 33, 257, 300)] == [
        1,
        4,
        8,
        16,
        16,
        24,
        48,
        257,
        300,
    ]  # above the largest size: eager, unpadded
    assert eager.padded_batch(9) == 9


@pytest.mark.parametrize("n,padded", [(9, 16), (13, 16), (17, 24), (40, 48), (129, 160)])
def test_decode_step_costs_what_its_padded_batch_costs(graphs, eager, n, padded):
    for ctx in (100, 1000, 3000):
        want = eager.step_time(BatchShape.decode(padded, ctx, 16))
        assert graphs.step_time(BatchShape.decode(n, ctx, 16)) == pytest.approx(want, rel=1e-12)
        # priced by the mean context of the real sequences, not padded rows of zero context
        shape = BatchShape(16, n, n, n * ctx, [ctx] * n)
        assert graphs.step_time(shape) == pytest.approx(want, rel=1e-12)
    assert graphs.step_time(BatchShape.decode(n, 1000, 16)) > eager.step_time(
        BatchShape.decode(n, 1000, 16)
    )


def test_captured_sizes_and_eager_steps_are_unchanged(graphs, eager):
    for n in (1, 4, 16, 64, 300):  # a captured size is its own padded size; 300 > 256 is eager
        s = BatchShape.decode(n, 700, 16)
        assert graphs.step_time(s) == eager.step_time(s)
    for s in (BatchShape.prefill(500, 1024, 16), BatchShape.mixed(256, 0, 9, 800, 16)):
        assert graphs.step_time(s) == eager.step_time(s)  # prefill/mixed steps run eagerly


def test_graph_step_time_is_a_step_function_of_the_batch(graphs):
    times = [graphs.step_time(BatchShape.decode(n, 512, 16)) for n in range(9, 17)]
    assert len(set(times)) == 1


def test_sizes_round_trip(tmp_path, clean_profile):
    path = graph_profile(clean_profile).save(tmp_path / "v3")
    assert Profile.load(path).metadata.cuda_graph_sizes == SIZES


@pytest.mark.parametrize("bad", [[0, 1], [4, 2], [2, 2], ["x"]])
def test_bad_sizes_are_refused(clean_profile, bad):
    with pytest.raises(ProfileError, match="cuda_graph_sizes"):
        graph_profile(clean_profile, bad)
