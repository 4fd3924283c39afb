"""Decode steps whose contexts differ in length: the launch rule the cost model shares with the
GPU backend, the spread cost fitted from decode_spread rows, and how decode steps are priced
with and without those rows."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.cost.base import BatchShape, longest_context
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.corrections.reread import shared_spread_shape
from pagesim.cost.corrections.spread import NO_SPLIT, DecodeKernel
from pagesim.cost.decode_launch import span_bucket, split_rule
from pagesim.cost.profile import (
    DecodeSharedRow,
    DecodeSharedSpreadRow,
    DecodeSpreadRow,
    Profile,
)
from pagesim.data import calibration_dir

SIZES = [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256]
KAPPA = 0.9e-6  # seconds per token of (longest - mean) program length: the synthetic law
SPREAD_POINTS = [(b, 1800, w) for b in (4, 8, 16, 24, 32, 64) for w in (600, 1700)]


def _with_kernel(profile: Profile) -> Profile:
    """The clean profile as a llama-2-7b graph profile that records the decode kernel."""
    meta = dataclasses.replace(
        profile.metadata,
        model="llama-2-7b",
        cuda_graph_sizes=SIZES,
        device={"num_sms": 132},
        decode_tile_n=64,
        decode_programs_per_sm=4,
    )
    return Profile(meta, profile.decode, profile.prefill, profile.mixed, ())


def _spread_rows(base: CalibratedCostModel) -> tuple[DecodeSpreadRow, ...]:
    """Rows that follow `KAPPA` exactly, 7 % slower than `base` (another GPU call)."""
    kernel = DecodeKernel.of(base.profile)
    rows = []
    for bs in (16, 32):
        for b, c, w in SPREAD_POINTS:
            uniform = base.step_time_breakdown(BatchShape.decode(b, c, bs))
            uniform_s = sum(uniform.values()) - uniform["host_overhead"]
            extra = KAPPA * kernel.program_spread(b, True, c, c + w)
            t, ref = 1.07e3 * (uniform_s + extra), 1.07e3 * uniform_s
            rows.append(DecodeSpreadRow(bs, b, c, c + w, t, t, t, 0.0, 0.0, ref))
    return tuple(rows)


@pytest.fixture(scope="module")
def plain(clean_profile) -> CalibratedCostModel:
    return CalibratedCostModel(_with_kernel(clean_profile))


@pytest.fixture(scope="module")
def spread(plain) -> CalibratedCostModel:
    return CalibratedCostModel(
        dataclasses.replace(plain.profile, decode_spread=_spread_rows(plain))
    )


def test_launch_rule_splits_by_waves_and_buckets_by_powers_of_two() -> None:
    # llama-2-7b on an H200: 16 x 32 programs fill one wave unsplit, 24 x 32 need two splits
    assert split_rule(16, 32, 4096, 64, 4, 132).num_partitions == 1
    assert split_rule(24, 32, 4096, 64, 4, 132).num_partitions == 2
    assert span_bucket(1801, 4096) == 2048 and span_bucket(3501, 4096) == 4096
    assert span_bucket(3000, 3500) == 3500  # capped at max_model_len, never below the step


def test_program_spread_is_the_longest_minus_the_mean_program() -> None:
    kernel = DecodeKernel(64, 4, 132, 32, 4096)
    assert kernel.partition_size(16, 4096) == NO_SPLIT
    assert kernel.program_spread(16, True, 1800, 3500) == 3501 - 1801  # one partition
    size = kernel.partition_size(24, 4096)
    assert size == 2048  # two partitions: programs are capped at the partition
    assert kernel.program_spread(24, True, 1800, 3500) == 2048 - 1801
    assert kernel.program_spread(16, True, 1800, 1800) == 0.0


def test_spread_cost_is_recovered_from_rows_of_another_call(spread, plain) -> None:
    assert plain.fits["spread"] == {}
    got = spread.fits["spread"]
    assert set(got) == {16, 32}
    for kappa in got.values():
        assert kappa == pytest.approx(KAPPA, rel=0.02)


def test_spread_contexts_cost_more_than_uniform_ones(spread, plain) -> None:
    contexts = [100 + 226 * i for i in range(16)]  # mean 1795, longest 3490
    mean = sum(contexts) // 16
    uneven = BatchShape(16, 16, 16, sum(contexts), contexts)
    even = BatchShape(16, 16, 16, mean * 16, [mean] * 16)
    assert plain.step_time(uneven) == pytest.approx(plain.step_time(even), rel=1e-3)
    extra = spread.step_time(uneven) - spread.step_time(even)
    assert extra == pytest.approx(KAPPA * (contexts[-1] - mean), rel=0.03)


def test_a_uniform_full_batch_prices_as_without_rows(spread, plain) -> None:
    for b, c in [(16, 1000), (64, 512), (1, 3000)]:
        shape = BatchShape.decode(b, c, 16)
        assert spread.step_time(shape) == pytest.approx(plain.step_time(shape), rel=1e-9)


def test_padding_rows_of_a_graph_own_no_context(spread, plain) -> None:
    # 10 sequences run the 16-sequence graph: with spread rows the work is 10 contexts
    shape = BatchShape.decode(10, 1024, 16)
    padded = BatchShape.decode(16, 640, 16)  # the same 10 x 1024 tokens over 16 rows
    assert spread.step_time(shape) == pytest.approx(spread.step_time(padded), rel=1e-9)
    assert plain.step_time(shape) == pytest.approx(plain.step_time(BatchShape.decode(16, 1024, 16)))


def test_longest_context_reads_views_without_iterating() -> None:
    class View(list):
        def longest(self) -> int:
            return 99

    assert longest_context([3, 9, 4]) == 9 and longest_context([]) == 0
    assert longest_context(View([1, 2])) == 99


def test_rows_round_trip(tmp_path, spread) -> None:
    loaded = Profile.load(spread.profile.save(tmp_path / "v5"))
    assert loaded.decode_spread == spread.profile.decode_spread
    assert loaded.metadata.decode_tile_n == 64


REREAD = 0.4  # the shared-block read cost the synthetic shared rows follow
SHARED_SPREAD_POINTS = [(b, s, 512, 448) for b in (32, 64, 128) for s in (512, 1024)]


def _shared_spread_rows(truth: CalibratedCostModel) -> tuple[DecodeSharedSpreadRow, ...]:
    """Rows priced by `truth` (spread cost and re-read fraction fitted), 7 % slower."""
    rows = []
    for bs in (16, 32):
        for b, s, own, w in SHARED_SPREAD_POINTS:
            row = DecodeSharedSpreadRow(bs, b, s + own, s + own + w, s, 0, 0, 0, 0, 0, 0)
            shape = shared_spread_shape(row)
            t = 1.07e3 * truth.device_time(shape)
            ref = 1.07e3 * truth.device_time(dataclasses.replace(shape, shared_context_tokens=0))
            rows.append(
                dataclasses.replace(
                    row,
                    step_time_ms=t,
                    step_time_p10_ms=t,
                    step_time_p90_ms=t,
                    reference_step_time_ms=ref,
                )
            )
    return tuple(rows)


def test_served_like_shared_rows_fit_the_reread_with_their_spread_priced(spread, tmp_path) -> None:
    # truth: the spread model plus uniform shared rows that follow REREAD
    uniform = []
    for bs in (16, 32):
        for b, c, s in [(16, 1024, 512), (64, 2048, 1024), (256, 1024, 896)]:
            t = spread.step_time(BatchShape.decode(b, round(c - (1 - REREAD) * s), bs)) * 1e3
            ref = spread.step_time(BatchShape.decode(b, c, bs)) * 1e3
            uniform.append(DecodeSharedRow(bs, b, c, s, t, t, t, 0.0, 0.0, ref))
    truth = CalibratedCostModel(dataclasses.replace(spread.profile, decode_shared=tuple(uniform)))
    assert truth.reread_fraction == {
        16: pytest.approx(REREAD, abs=0.011),
        32: pytest.approx(REREAD, abs=0.011),
    }
    rows = _shared_spread_rows(truth)
    shape = shared_spread_shape(rows[-1])  # 128 x (1024 shared + 64 .. 960 own)
    assert (
        shape.num_decode_seqs,
        min(shape.decode_context_tokens),
        max(shape.decode_context_tokens),
    ) == (128, 1024 + 64, 1024 + 960)
    assert shape.decode_context_sum == 128 * (1024 + 512)
    assert shape.shared_context_tokens == 128 * 1024
    even = dataclasses.replace(shape, decode_context_tokens=[1536] * 128)
    assert truth.device_time(shape) > truth.device_time(even)  # the rows hold a spread cost
    only_spread = CalibratedCostModel(
        dataclasses.replace(spread.profile, decode_shared_spread=rows)
    )
    assert only_spread.reread_fraction == truth.reread_fraction
    # with uniform rows of another law beside them, the served-like rows decide
    other_law = tuple(
        dataclasses.replace(r, step_time_ms=r.reference_step_time_ms) for r in uniform
    )  # r = 1: no saving at all
    assert CalibratedCostModel(
        dataclasses.replace(spread.profile, decode_shared=other_law)
    ).reread_fraction == {16: 1.0, 32: 1.0}
    both = CalibratedCostModel(
        dataclasses.replace(spread.profile, decode_shared=other_law, decode_shared_spread=rows)
    )
    assert both.reread_fraction == truth.reread_fraction
    loaded = Profile.load(only_spread.profile.save(tmp_path / "p"))
    assert loaded.decode_shared_spread == rows


@pytest.mark.parametrize(("name", "kv_heads"), [("qwen3-30b-a3b", 4), ("gemma-2-9b", 8)])
def test_models_of_shipped_configs_get_the_decode_kernel_and_its_spread(name, kv_heads) -> None:
    """A profile of a model built from a shipped config.json (not a hand-written spec) knows
    its KV heads and decode kernel, so the spread correction is fitted from its rows."""
    profile = Profile.load(calibration_dir() / "h200" / name)
    assert profile.metadata.kv_heads_per_gpu == kv_heads
    kernel = DecodeKernel.of(profile)
    assert kernel is not None and kernel.num_kv_heads == kv_heads
    assert kernel.sliding_window is None  # gemma-2-9b is hybrid: planned as full attention
    model = CalibratedCostModel(profile)
    assert model._spread and all(k > 0 for k in model._spread.values())
