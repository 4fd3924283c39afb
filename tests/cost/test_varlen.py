"""The variable-length kernel's attention model: program counting, the grid-order schedule,
the fit, and its use by the calibrated cost model."""

from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import MultiPrefillRow, Profile
from pagesim.cost.varlen_launch import (
    PROGRAM_OVERHEAD_TILES,
    SLOTS_GRID,
    Launch,
    VarlenFit,
    VarlenKernel,
    fit_varlen,
    fit_varlen_overhead,
    launch_of,
    makespans,
    shape_launch,
)
from pagesim.specs import MODELS

KERNEL = VarlenKernel(block_q=128, tile_n=64, max_graph_seqs=512, num_kv_heads=8)


def brute_force(kernel: VarlenKernel, entries, decodes, padded) -> tuple[Launch, np.ndarray]:
    """Every program of the launch, one by one (per KV head), decodes first: the launch's
    counts and the programs' lengths."""
    keys = [c + 1 for c in decodes]
    for q, c in entries:
        for j in range(math.ceil(q / kernel.block_q)):
            keys.append(c + min((j + 1) * kernel.block_q, q))
    tiles = [k / kernel.tile_n + PROGRAM_OVERHEAD_TILES for k in keys]
    tokens = sum(q for q, _ in entries) + len(decodes)
    seqs = len(entries) + len(decodes)
    launched = (
        tokens // kernel.block_q + seqs
        if padded is None
        else padded // kernel.block_q + min(padded, kernel.max_graph_seqs)
    )
    return Launch(sum(tiles), max(tiles, default=0.0), len(keys), launched), np.array(tiles)


def greedy_schedule(programs, heads: int, slots: int) -> float:
    """The exact schedule: every head's programs in turn, each to the first free slot."""
    free = [0.0] * slots
    end = 0.0
    for _ in range(heads):
        for x in programs:
            t = heapq.heappop(free) + x
            heapq.heappush(free, t)
            end = max(end, t)
    return end


def test_a_hand_counted_launch() -> None:
    # 300 new over 100 cached: programs of 228, 356 and 400 keys
    got = launch_of(KERNEL, [(300, 100)], [], None)
    assert got.work == pytest.approx((228 + 356 + 400) / 64 + 3)
    assert got.longest == pytest.approx(400 / 64 + 1)
    assert (got.used, got.launched, got.surplus) == (3, 300 // 128 + 1, 0)
    graph = launch_of(KERNEL, [(300, 100)], [], 320)
    assert graph.surplus == 320 // 128 + 320 - 3  # padded sequences' programs exit at once


@settings(max_examples=60, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(1, 700), st.integers(0, 3000)), max_size=5),
    decodes=st.lists(st.integers(1, 4000), max_size=40),
    block_q=st.sampled_from([16, 32, 128]),
    graph=st.booleans(),
)
def test_closed_form_counts_every_program(entries, decodes, block_q, graph) -> None:
    kernel = VarlenKernel(block_q, 64, 256)
    tokens = sum(q for q, _ in entries) + len(decodes)
    padded = max(tokens, 1) * 2 if graph else None
    got = launch_of(kernel, entries, decodes, padded)
    want, programs = brute_force(kernel, entries, decodes, padded)
    assert got.work == pytest.approx(want.work)
    assert got.longest == pytest.approx(want.longest)
    assert (got.used, got.launched) == (want.used, want.launched)
    for j, length in got.candidates():  # the programs that can end the launch, as counted
        assert length == pytest.approx(programs[j])
    shape = BatchShape(
        16,
        tokens,
        len(decodes),
        sum(decodes),
        list(decodes),
        [q for q, _ in entries],
        [c for _, c in entries],
    )
    assert shape_launch(kernel, shape, padded) == got


def of_lengths(lengths, heads: int) -> Launch:
    """A launch of decodes only whose programs have these lengths (tile iterations)."""
    kernel = VarlenKernel(block_q=1, tile_n=1, max_graph_seqs=0, num_kv_heads=heads)
    return launch_of(kernel, [], [x - 1.0 - PROGRAM_OVERHEAD_TILES for x in lengths], None)


def test_a_launch_that_fits_at_once_lasts_its_longest_program() -> None:
    launch = of_lengths([3.0, 9.0, 2.0], heads=4)
    assert [launch.makespan(12), launch.makespan(100)] == [9.0, 9.0]
    assert greedy_schedule([3.0, 9.0, 2.0], 4, 12) == 9.0


def test_the_last_heads_long_program_starts_after_the_other_heads_work() -> None:
    # 8 heads of [one 40-tile decode, 30 one-tile programs], 64 slots: the last head's long
    # decode is handed out after the other heads' work; max(work / slots, longest) misses it
    lengths = [40.0] + [1.0] * 30
    exact = greedy_schedule(lengths, 8, 64)
    fluid = of_lengths(lengths, 8).makespan(64)
    assert exact == 43.0  # the last head's decode starts 3 tiles in
    assert fluid == pytest.approx(exact, rel=0.1)
    assert max(40.0, 8 * sum(lengths) / 64) == 40.0  # the old critical path


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.floats(2.0, 80.0), min_size=1, max_size=60),
    heads=st.integers(1, 32),
    slots=st.integers(1, 400),
)
def test_fluid_schedule_stays_within_the_greedy_bounds(lengths, heads, slots) -> None:
    """Both the exact greedy schedule and its fluid form lie between the lower bound
    max(longest, all work / slots) and Graham's bound all work / slots + longest."""
    x = np.array(lengths)
    low = max(x.max(), heads * x.sum() / slots)
    high = heads * x.sum() / slots + x.max()
    exact = greedy_schedule(x, heads, slots)
    fluid = of_lengths(lengths, heads).makespan(slots)
    for t in (exact, fluid):
        assert low - 1e-9 <= t <= high + 1e-9
    if heads * len(x) <= slots:
        assert fluid == pytest.approx(exact) and exact == x.max()


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(1, 700), st.integers(0, 3000)), max_size=4),
    decodes=st.lists(st.integers(1, 4000), max_size=40),
    heads=st.integers(1, 32),
    reread=st.floats(0.05, 1.0),
    slots=st.sampled_from(SLOTS_GRID),
)
def test_shared_reads_shorten_every_program_alike(entries, decodes, heads, reread, slots) -> None:
    kernel = VarlenKernel(block_q=32, tile_n=64, max_graph_seqs=512, num_kv_heads=heads)
    launch = launch_of(kernel, entries, decodes, None)
    shared = launch.reread(0.5, reread)
    assert shared.makespan(slots) == pytest.approx(launch.makespan(slots) * shared.scale)
    assert shared.work == pytest.approx(launch.work * shared.scale)


@settings(max_examples=100, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(1, 700), st.integers(0, 3000)), max_size=4),
    decodes=st.lists(st.integers(1, 4000), max_size=40),
    heads=st.integers(1, 32),
    reread=st.floats(0.05, 1.0),
)
def test_the_fits_schedules_are_the_pricing_ones(entries, decodes, heads, reread) -> None:
    """`makespans` (numpy, every slot count of the fit at once) is `Launch.makespan`."""
    kernel = VarlenKernel(block_q=32, tile_n=64, max_graph_seqs=512, num_kv_heads=heads)
    launch = launch_of(kernel, entries, decodes, None).reread(0.5, reread)
    assert makespans(launch, SLOTS_GRID) == pytest.approx(
        [launch.makespan(slots) for slots in SLOTS_GRID]
    )


@settings(max_examples=200, deadline=None)
@given(
    entries=st.lists(st.tuples(st.integers(1, 700), st.integers(0, 3000)), max_size=4),
    decodes=st.lists(st.one_of(st.integers(1, 4000), st.floats(1.0, 4000.0)), max_size=12),
    block_q=st.sampled_from([16, 32, 128]),
    overhead=st.sampled_from([0.5, 1.0, 3.0]),
)
def test_prefixes_are_prefix_float_for_float(entries, decodes, block_q, overhead) -> None:
    """`Launch.prefixes` (one pass, for the fit) gives `_prefix`'s floats exactly."""
    kernel = VarlenKernel(block_q=block_q, tile_n=64, max_graph_seqs=512, program_overhead=overhead)
    launch = launch_of(kernel, entries, decodes, None)
    expected = [launch._prefix(i) for i in range(launch.used)]
    assert [float(x).hex() for x in launch.prefixes()] == [float(x).hex() for x in expected]


def _rows(truth: VarlenFit):
    rows = []
    # some steps bound by their work, some (one long context, little work) by one program
    for q, c, k in [
        (16, 0, 1),
        (128, 0, 1),
        (512, 1024, 1),
        (2048, 0, 1),
        (64, 0, 16),
        (128, 1024, 4),
        (512, 0, 8),
        (300, 100, 2),
        (16, 3000, 1),
        (32, 4000, 1),
        (16, 2000, 2),
    ]:
        for graph in (True, False):
            decodes = 128 if q == 300 else 0  # one step mixes 128 decodes of 512 tokens
            launch = launch_of(KERNEL, [(q, c)] * k, [512] * decodes, 512 if graph else None)
            att = truth(launch, graph)
            rows.append((launch, graph, att, att + 0.01))
    return rows


def test_fit_recovers_the_law_it_was_made_from() -> None:
    truth = VarlenFit(2e-4, 9e-4, 6e-5, 8e-6, SLOTS_GRID[43], 0.0)
    fit = fit_varlen(_rows(truth))
    assert fit.slots == truth.slots
    for name in ("alpha_graph", "alpha_eager", "beta", "gamma"):
        assert getattr(fit, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fit.rms < 1e-9
    assert fit_varlen(_rows(truth)[:4]) is None  # too few rows to fit four terms


def test_fit_finds_the_program_overhead_the_rows_were_made_with() -> None:
    """Rows whose programs each cost 3 tile iterations beyond their keys: the overhead search
    finds 3, and the law's coefficients with it, for every block size."""
    truth = VarlenFit(2e-4, 9e-4, 6e-5, 8e-6, SLOTS_GRID[43], 0.0)
    made_with = dataclasses.replace(KERNEL, program_overhead=3.0)
    rows: dict[int, list] = {}
    for bs in (16, 32):
        for q, c, k, d in [
            (16, 0, 1, 0),
            (128, 0, 1, 0),
            (512, 1024, 1, 0),
            (2048, 0, 1, 0),
            (64, 0, 16, 0),
            (128, 1024, 4, 0),
            (512, 0, 8, 0),
            (300, 100, 1, 128),
            (16, 3000, 1, 0),
            (32, 4000, 1, 0),
            (16, 2000, 2, 0),
            (64, 0, 1, 96),
        ]:
            shape = (
                BatchShape.mixed(q, c, d, 700, bs)
                if d
                else BatchShape(
                    bs, q * k, prefill_new_tokens=[q] * k, prefill_context_tokens=[c] * k
                )
            )
            for padded in (512, None):
                att = truth(shape_launch(made_with, shape, padded), padded is not None)
                rows.setdefault(bs, []).append((shape, padded, att, att + 0.01))
    kernel, fits = fit_varlen_overhead(KERNEL, rows)
    assert kernel.program_overhead == 3.0 and set(fits) == {16, 32}
    for fit in fits.values():
        assert fit.slots == truth.slots and fit.rms < 1e-9
        assert fit.beta == pytest.approx(truth.beta, rel=1e-6)
    assert launch_of(kernel, [(100, 0)], [], None).work == pytest.approx(100 / 64 + 3.0)


def _with_varlen(profile: Profile, truth: VarlenFit) -> Profile:
    """The clean profile with prefill, mixed and multi rows whose attention follows `truth`
    on top of the profile's own `other` line (so the fit must find `truth` again)."""
    meta = dataclasses.replace(
        profile.metadata, varlen_block_q=KERNEL.block_q, varlen_tile_n=KERNEL.tile_n
    )
    base = CalibratedCostModel(profile)
    spec = MODELS.get(meta.model)  # the grid's KV heads, as the calibrated model counts them
    kernel = dataclasses.replace(KERNEL, num_kv_heads=spec.num_kv_heads if spec else 1)

    def step(shape: BatchShape) -> float:
        other = base.step_time_breakdown(shape)["other"]
        return (other + truth(shape_launch(kernel, shape, None), False)) * 1e3

    prefill = tuple(
        dataclasses.replace(
            r,
            step_time_ms=(
                t := step(BatchShape.prefill(r.num_new_tokens, r.num_cached_tokens, r.block_size))
            ),
            step_time_p10_ms=t,
            step_time_p90_ms=t,
        )
        for r in profile.prefill
    )
    multi = []
    for k, n, c in [(2, 64, 0), (4, 256, 1024), (16, 32, 0), (8, 512, 512)]:
        shape = BatchShape(16, k * n, prefill_new_tokens=[n] * k, prefill_context_tokens=[c] * k)
        t = step(shape)
        multi.append(
            MultiPrefillRow(
                16, k, n, c, t, t, t, 0.0, base.step_time_breakdown(shape)["other"] * 1e3
            )
        )
    return Profile(meta, profile.decode, prefill, (), (), (), tuple(multi))


def test_calibrated_model_prices_prefill_steps_with_the_fit(clean_profile) -> None:
    truth = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)
    profile = _with_varlen(clean_profile, truth)
    model = CalibratedCostModel(profile)
    assert set(model.fits["varlen"]) == {r.block_size for r in profile.prefill}
    assert model.fits["varlen"][16].beta == pytest.approx(truth.beta, rel=1e-3)
    for r in profile.multi_prefill:
        shape = BatchShape(
            16,
            r.num_entries * r.num_new_tokens,
            prefill_new_tokens=[r.num_new_tokens] * r.num_entries,
            prefill_context_tokens=[r.num_cached_tokens] * r.num_entries,
        )
        assert model.step_time(shape) * 1e3 == pytest.approx(r.step_time_ms, rel=1e-3)
    # without the kernel's tiles in the metadata, prefill steps are priced per entry
    plain = CalibratedCostModel(
        Profile(
            dataclasses.replace(profile.metadata, varlen_block_q=0, varlen_tile_n=0),
            profile.decode,
            profile.prefill,
            (),
            (),
            (),
            profile.multi_prefill,
        )
    )
    assert plain.fits["varlen"] == {}
    big = BatchShape(16, 16 * 512, prefill_new_tokens=[512] * 16, prefill_context_tokens=[512] * 16)
    assert plain.step_time(big) != pytest.approx(model.step_time(big), rel=1e-3)


def test_fit_report_holds_out_multi_prefill_rows(clean_profile) -> None:
    from pagesim.cost.fit import fit_report

    truth = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[43], 0.0)
    report = fit_report(_with_varlen(clean_profile, truth), holdout_fraction=0.5)
    rows = {r.table: r for r in report.rows}
    assert rows["multi_prefill"].num_holdout == 2 and rows["multi_prefill"].num_fit == 2
    assert rows["multi_prefill"].mape_pct < 1.0  # the law is exact: held-out rows follow it


def test_varlen_reread_fraction_is_recovered_and_applied(clean_profile) -> None:
    from pagesim.cost.profile import VarlenSharedRow

    # a GPU that runs one program at a time: every step bound by its work, not a program
    truth = VarlenFit(9e-4, 9e-4, 6e-5, 0.0, SLOTS_GRID[0], 0.0)
    base_profile = _with_varlen(clean_profile, truth)
    base = CalibratedCostModel(base_profile)
    reread = 0.6
    rows = []
    for d, dc, k, n, sh in [
        (0, 0, 4, 128, 1024),
        (0, 0, 16, 32, 1024),
        (32, 1280, 1, 256, 1024),
        (64, 2304, 2, 128, 2048),
    ]:
        shape = BatchShape(
            16,
            d + k * n,
            d,
            d * dc,
            [dc] * d,
            [n] * k,
            [sh] * k,
            shared_context_tokens=(d + k) * sh,
        )
        plain = dataclasses.replace(shape, shared_context_tokens=None)
        ref = base.step_time(plain) * 1e3
        padded = base.padded_tokens(shape.total_tokens)
        other = base.step_time_breakdown(plain)["other"]
        launch = base._discounted(shape_launch(base._varlen_kernel, shape, padded), shape, reread)
        t = (other + base.fits["varlen"][16](launch, padded is not None)) * 1e3
        assert t < ref  # sharing saves reads
        rows.append(VarlenSharedRow(16, d, dc, k, n, sh, 1.1 * t, t, t, 0.0, 0.0, 1.1 * ref))
    model = CalibratedCostModel(
        Profile(
            base_profile.metadata,
            base_profile.decode,
            base_profile.prefill,
            (),
            (),
            (),
            base_profile.multi_prefill,
            varlen_shared=tuple(rows),
        )
    )
    assert model.fits["reread_varlen"] == {16: pytest.approx(reread, abs=0.011)}
    assert base.fits["reread_varlen"] == {}
    shared = BatchShape(
        16, 32 + 256, 32, 32 * 1280, [1280] * 32, [256], [1024], shared_context_tokens=33 * 1024
    )
    assert model.step_time(shared) < model.step_time(
        dataclasses.replace(shared, shared_context_tokens=None)
    )
