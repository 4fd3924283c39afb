"""CPU parts of the calibration: grid filtering, synthetic steps (as the cost model sees them),
block sources, host-overhead binning, and a whole dry-run calibration on the tiny model whose
profile loads and drives the calibrated cost model."""

from __future__ import annotations

import math

import pytest
import torch

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.decode_launch import span_bucket
from pagesim.cost.profile import Profile
from pagesim.gpu.calibrate import (
    BlockSource,
    CalibrationGrid,
    calibration_entries,
    decode_points,
    fitted_spread,
    overhead_requests,
    overhead_rows,
    prefill_points,
    synthetic_step,
)
from pagesim.gpu.cuda_graphs import CAPTURE_SIZES
from pagesim.gpu.overhead import (
    JOIN_GAP_S,
    JOIN_GROUP_SIZES,
    JOIN_START_S,
    NUM_JOINING,
    admission_overhead,
    join_times,
    ramp_prompt_len,
)
from pagesim.gpu.profiler import gpu_key, run_calibration
from pagesim.gpu.serve import ServeStep


def test_points_respect_model_length_cache_and_batch_limits() -> None:
    grid = CalibrationGrid(
        decode_batches=(1, 8, 64),
        decode_contexts=(100, 1000, 5000),
        prefill_tokens=(16, 4096, 16384),
        prefill_cached=(0, 2048),
    )
    dec = decode_points(grid, max_model_len=4096, capacity_tokens=64 * 1001, max_num_seqs=32)
    assert (1, 4095) in dec  # the longest context is capped at max_model_len - 1
    assert all(b <= 32 and b * (c + 1) <= 64 * 1001 and c < 4096 for b, c in dec)
    assert (64, 100) not in dec  # over max_num_seqs
    pre = prefill_points(grid, max_model_len=4096, max_num_batched_tokens=8192)
    assert (16, 2048) in pre and (4096, 0) in pre
    assert (4096, 2048) not in pre and all(n <= 8192 for n, _ in pre)


@pytest.mark.parametrize("model", ["opt-13b", "llama-2-7b", "llama-3-8b"])
def test_every_default_grid_entry_fits_the_model_and_the_step_budgets(model: str) -> None:
    """opt-13b (2,048 tokens) once got a mixed point whose decodes read 2,049 tokens: one
    block more than the CUDA graphs' block table holds."""
    config = EngineConfig.create(model=model, gpu="h200")
    for bs in (8, 16, 32, 64, 128):
        entries = calibration_entries(
            CalibrationGrid(), config.replace(block_size=bs), full=True, capacity=10**9
        )
        kinds = {kind for kind, *_ in entries}
        assert {"decode", "prefill", "mixed", "multi", "spread"} <= kinds
        for kind, key, spec, _ in entries:
            assert max(c + n for c, n in spec) <= config.max_model_len, (kind, key)
            assert len(spec) <= config.max_num_seqs, (kind, key)
            if kind != "decode":  # decode points are timed as a graph batch, whatever size
                assert sum(n for _, n in spec) <= config.max_num_batched_tokens, (kind, key)


def test_spread_points_shrink_to_fit_a_short_model() -> None:
    assert fitted_spread(1800, 600, 8192) == (1800, 600)
    assert fitted_spread(1800, 1700, 3501) == (1800, 1700)  # 3,500 + 1 fits exactly
    mean, half = fitted_spread(1800, 1700, 2048)
    assert (mean, half) == (1052, 994) and mean + half + 1 <= 2048


def test_default_decode_batches_hold_every_graph_size_up_to_64_but_2() -> None:
    """A padded decode graph between two timed batches can split its contexts unlike both
    (llama-2-13b: 24 sequences unsplit, 16 and 32 split), so those sizes are timed."""
    batches = set(CalibrationGrid().decode_batches)
    assert {s for s in CAPTURE_SIZES if s <= 64} - batches == {2}


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b", "llama-2-13b"])
def test_some_spread_points_share_their_twins_span_bucket(model: str) -> None:
    """The spread cost is fitted as the spread step's ratio to its uniform twin: a twin in
    another span bucket runs other partitions, and the ratio then holds more than the spread
    (qwen2.5-7b's block-32 cost fell from 3.15 to 1.04 us per token with same-bucket twins).
    Every model of at least 4,096 tokens gets same-bucket points up to 128 sequences."""
    config = EngineConfig.create(model=model, gpu="h200")
    entries = calibration_entries(
        CalibrationGrid(), config.replace(block_size=16), full=True, capacity=10**9
    )
    same = [
        key
        for kind, key, _, _ in entries
        if kind == "spread"
        and span_bucket(key[1] + 1, config.max_model_len)
        == span_bucket(key[2] + 1, config.max_model_len)
    ]
    assert {b for b, _, _ in same} == {4, 8, 16, 24, 32, 64, 96, 128}
    assert all(c < longest for _, c, longest in same)


def test_block_source_hands_out_distinct_blocks_or_none() -> None:
    src = BlockSource(11, seed=3)
    rows = src.take([4, 6])
    flat = [b for r in rows for b in r]
    assert len(flat) == len(set(flat)) == 10 and 0 not in flat
    assert src.take([11]) is None
    assert BlockSource(11, seed=3).ids == src.ids  # seeded


def test_synthetic_steps_have_the_shape_the_cost_model_sees() -> None:
    src = BlockSource(1000)
    dec = synthetic_step([(300, 1)] * 5, 16, src)
    shape = BatchShape.from_scheduler_output(dec)
    assert shape.is_pure_decode and shape.num_decode_seqs == 5
    assert shape.decode_context_tokens == [300] * 5
    assert all(len(s.block_ids) == -(-301 // 16) for s in dec.scheduled)
    mixed = synthetic_step([(200, 1)] * 3 + [(64, 128)], 16, src)
    shape = BatchShape.from_scheduler_output(mixed)
    assert shape.num_decode_seqs == 3 and shape.prefill_new_tokens == [128]
    assert shape.prefill_context_tokens == [64] and shape.total_tokens == 131
    assert synthetic_step([(5000, 1)] * 10, 16, src) is None  # more K/V than the cache holds


def test_a_synthetic_decode_batch_computes_a_different_token_per_request() -> None:
    # An MoE layer routes by token: one repeated token would read one top-k set of experts.
    dec = synthetic_step([(300, 1)] * 64, 16, BlockSource(2000))
    last = [s.request.token_ids_slice(300, 301)[0] for s in dec.scheduled]
    assert len(set(last)) == 64


def test_overhead_rows_bin_host_time_by_batch_size() -> None:
    steps = [
        ServeStep(0.0, n, n, 0.0, 0.010, 0.0, 0.010 + 1e-4 * n)
        for n in (1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4)
    ]
    rows = overhead_rows(steps, max_reqs=4)
    by = {r.num_reqs: r.overhead_ms for r in rows}
    assert by[1] == pytest.approx(0.1)
    assert by[2] == pytest.approx(0.2)  # [1.41, 2.83) holds only batch 2
    assert by[4] == pytest.approx(0.35)  # [2.83, 5.66) holds batches 3 and 4


def test_overhead_rows_leave_out_steps_with_prefill_entries() -> None:
    steps = [ServeStep(0.0, 2, 2, 0.0, 0.010, 0.0, 0.0101) for _ in range(3)]
    steps += [ServeStep(0.0, 2, 300, 0.0, 0.010, 0.0, 0.0150, 1) for _ in range(5)]
    assert [r.overhead_ms for r in overhead_rows(steps, max_reqs=2)] == [pytest.approx(0.1)] * 1


def _admission_step(n: int, k: int, stall_ms: float = 0.0) -> ServeStep:
    """A step of n requests, k of them prefill entries: decode-only host time 0.1 ms + 0.01 ms
    per request; admitting steps add 0.2 + 0.15 * k; `stall_ms` more if the host held it up."""
    host_ms = 0.1 + 0.01 * n + (0.2 + 0.15 * k if k else 0.0) + stall_ms
    return ServeStep(0.0, n, n + 100 * k, 0.0, 0.010, 0.0, 0.010 + host_ms * 1e-3, k)


def test_admission_overhead_recovers_per_step_and_per_entry_costs() -> None:
    step = _admission_step
    steps = [step(n, 0) for n in (1, 2, 4, 8, 16) for _ in range(3)]
    steps += [step(n, k) for n in (3, 6, 12) for k in (1, 2, 5)]
    rows = overhead_rows(steps, max_reqs=16)
    base, per_entry = admission_overhead(steps, rows)
    assert base == pytest.approx(0.2, abs=0.02) and per_entry == pytest.approx(0.15, abs=0.005)
    assert admission_overhead(steps[:15], rows) is None  # no admitting step
    assert admission_overhead(steps, []) is None  # no table to measure the excess against


def test_admission_overhead_is_not_moved_by_one_slow_step() -> None:
    # one 1-entry step held up 5 ms: a least-squares line over single steps fits 1.07 + 0.014
    step = _admission_step
    steps = [step(n, 0) for n in (1, 2, 4, 8, 16) for _ in range(3)]
    steps += [step(n, k) for n in (3, 6, 12) for k in (1, 2, 4, 8)]
    steps.append(step(6, 1, stall_ms=5.0))
    base, per_entry = admission_overhead(steps, overhead_rows(steps, max_reqs=16))
    assert base == pytest.approx(0.2, abs=0.02) and per_entry == pytest.approx(0.15, abs=0.005)


def test_admission_overhead_with_one_entry_count_is_all_per_step() -> None:
    steps = [ServeStep(0.0, 4, 4, 0.0, 0.010, 0.0, 0.0101) for _ in range(3)]
    steps += [ServeStep(0.0, 4, 104, 0.0, 0.010, 0.0, 0.0101 + e, 1) for e in (3e-4, 4e-4, 5e-4)]
    base, per_entry = admission_overhead(steps, overhead_rows(steps, max_reqs=4))
    assert (base, per_entry) == (pytest.approx(0.4), 0.0)


def test_overhead_ramp_lengths() -> None:
    reqs = overhead_requests(4)
    assert [r.max_tokens for r in reqs] == [2, 4, 6, 8]
    assert all(r.arrival_time == 0.0 and r.num_prompt_tokens == 64 for r in reqs)
    joined = overhead_requests(4, prompt_len=100, num_joining=10)
    groups = [0, 1, 1, 2, 2, 2, 2, 3, 3, 3]  # sizes 1, 2, 4, then 3 of the next 8
    assert [r.arrival_time for r in joined[4:]] == pytest.approx(
        [JOIN_START_S + g * JOIN_GAP_S for g in groups]
    )
    assert all(r.num_prompt_tokens == 100 for r in joined)
    assert len({tuple(r.prompt_token_ids[:4]) for r in joined}) == 14  # no shared prefix


def test_joining_groups_cycle_through_every_size() -> None:
    times = join_times(NUM_JOINING)
    sizes = [times.count(t) for t in sorted(set(times))]
    assert len(times) == NUM_JOINING
    assert sizes == [JOIN_GROUP_SIZES[g % len(JOIN_GROUP_SIZES)] for g in range(len(sizes))]


def test_ramp_prompt_length_fits_the_cache() -> None:
    assert ramp_prompt_len(256, 235_456) == 479  # 188,364 // 256 - 256: the cache binds
    assert ramp_prompt_len(256, 10**7) == 1024
    assert ramp_prompt_len(256, 1000) == 64


def test_gpu_key() -> None:
    assert gpu_key("NVIDIA H200") == "h200"
    assert gpu_key("NVIDIA H100 80GB HBM3") == "h100-sxm"
    assert gpu_key("NVIDIA A100-SXM4-40GB") == "a100-40gb"
    assert gpu_key("Some New GPU") == "some-new-gpu"


@pytest.mark.slow
def test_dry_run_calibration_writes_a_loadable_profile(tmp_path, monkeypatch) -> None:
    from pagesim.gpu import calibrate

    prefixes = []

    def named(*args, request_prefix="cal", **kwargs):
        prefixes.append(request_prefix)
        return synthetic_step(*args, request_prefix=request_prefix, **kwargs)

    monkeypatch.setattr(calibrate, "synthetic_step", named)
    config = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    grid = CalibrationGrid(
        block_sizes=(16,),
        full_block_sizes=(16,),
        decode_batches=(1, 2),
        decode_contexts=(16,),
        prefill_tokens=(16,),
        prefill_cached=(0,),
        mixed=(),
        multi_prefill=((2, 16, 0), (8, 16, 0)),
        decode_shared=((2, 32, 16), (2, 32, 24)),  # 24: not whole blocks
        varlen_shared=((1, 40, 2, 8, 32),),
        decode_shared_spread=((2, 16, 16, 8), (2, 24, 16, 8)),
        decode_spread=(),
        overhead_max_reqs=2,
        repeats=3,
    )
    seen = []
    res = run_calibration(
        config,
        grid,
        dtype=torch.float32,
        calibration_root=tmp_path,
        progress=lambda d, t, label: seen.append((d, t)),
        log=lambda m: None,
        device="cpu",
    )
    # 10 points (three shared rows, each with its unshared reference) + 5 attention-skipped
    # variants (the shared decode rows reuse the batch-2 one); 8 entries exceed
    # max_num_seqs=4 and 24 shared tokens are not whole blocks: dropped
    assert seen[-1][0] == seen[-1][1] == 15
    # every grid point names its requests apart, so its block-table rows stay in place
    assert len(prefixes) == len(set(prefixes)) >= 10
    prof = Profile.load(res.directory)
    assert res.directory == tmp_path / "cpu" / "tiny-llama"
    assert prof.metadata.synthetic and prof.metadata.num_gpu_blocks == {16: 64}
    assert [(r.batch_size, r.context_len) for r in prof.decode] == [(1, 16), (2, 16)]
    assert [(r.num_new_tokens, r.num_cached_tokens) for r in prof.prefill] == [(16, 0)]
    assert [(r.num_entries, r.num_new_tokens, r.num_cached_tokens) for r in prof.multi_prefill] == [
        (2, 16, 0)
    ]
    assert [(r.batch_size, r.context_len, r.shared_len) for r in prof.decode_shared] == [
        (2, 32, 16)
    ]
    assert prof.decode_shared[0].reference_step_time_ms > 0
    assert [(r.num_decodes, r.num_entries, r.shared_len) for r in prof.varlen_shared] == [
        (1, 2, 32)
    ]
    assert prof.varlen_shared[0].reference_step_time_ms > 0
    # contexts 16 + (8, 24): the shared prefix, then own parts over 16 +- 8
    assert [
        (r.batch_size, r.context_len, r.longest_context_len, r.shared_len)
        for r in prof.decode_shared_spread
    ] == [(2, 32, 40, 16)]
    assert prof.decode_shared_spread[0].reference_step_time_ms > 0
    for r in (
        prof.decode
        + prof.prefill
        + prof.multi_prefill
        + prof.decode_shared
        + prof.decode_shared_spread
    ):
        assert r.step_time_p10_ms <= r.step_time_ms <= r.step_time_p90_ms
        assert r.attention_ms + r.other_ms == pytest.approx(r.step_time_ms)
    assert prof.overhead and all(r.overhead_ms > 0 for r in prof.overhead)
    model = CalibratedCostModel(prof)
    assert model.step_time(BatchShape.decode(2, 16, 16)) > 0


class _RecordingRunner:
    """Records which (step, skip_attention) each execute_model call ran."""

    def __init__(self) -> None:
        self.skip_attention = False
        self.calls: list[tuple[int, bool]] = []

    def execute_model(self, out):
        self.calls.append((out.step_id, self.skip_attention))


@pytest.mark.slow
def test_a_shard_calibration_is_the_same_driver_with_a_solo_world(tmp_path) -> None:
    """`tensor_parallel_size` 2 in one process: rank 0's shard alone, saved apart from the
    whole model's profile and marked as holding no all-reduce."""
    config = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=2,
        max_num_batched_tokens=32,
        max_model_len=64,
        num_gpu_blocks_override=32,
        tensor_parallel_size=2,
    )
    grid = CalibrationGrid(
        block_sizes=(16,),
        full_block_sizes=(16,),
        decode_batches=(1,),
        decode_contexts=(16, 32),
        prefill_tokens=(16,),
        prefill_cached=(0,),
        mixed=(),
        overhead_max_reqs=2,
        repeats=1,
        min_repeats=1,
    )
    res = run_calibration(
        config,
        grid,
        dtype=torch.float32,
        calibration_root=tmp_path,
        log=lambda m: None,
        device="cpu",
    )
    assert res.directory == tmp_path / "cpu" / "tiny-llama-tp2-shard"
    meta = Profile.load(res.directory).metadata
    assert meta.tensor_parallel_size == 2 and not meta.allreduce_in_step_times
    assert "Rank 0's shard of a 2-way split" in meta.method
    assert (
        res.model.tp_size == 2 and res.model.num_heads == config.model_spec.num_attention_heads // 2
    )


def test_interleaved_rounds_time_every_item_once_per_round_in_shuffled_order() -> None:
    from pagesim.gpu.calibrate import measure_interleaved
    from pagesim.scheduler.output import SchedulerOutput

    items = [(SchedulerOutput(step_id=i), i % 2 == 1) for i in range(6)]
    runner = _RecordingRunner()
    grid = CalibrationGrid(repeats=4)
    timings = measure_interleaved(runner, items, grid, seed=1)
    warm, timed = runner.calls[:12], runner.calls[12:]
    assert warm == [c for i in range(6) for c in [(i, i % 2 == 1)] * 2]  # 2 warm-ups each
    rounds = [timed[r * 6 : (r + 1) * 6] for r in range(4)]
    assert len(timed) == 24 and all(
        sorted(r) == [(i, i % 2 == 1) for i in range(6)] for r in rounds
    )
    assert len({tuple(r) for r in rounds}) > 1  # the order changes between rounds
    assert all(len(t.samples) == 4 for t in timings) and runner.skip_attention is False


def test_shared_prefix_steps_share_their_first_blocks() -> None:
    blocks = BlockSource(64, 0)
    out = synthetic_step([(40, 1)] * 3, 16, blocks, shared=32)
    rows = [sr.block_ids for sr in out.scheduled]
    assert all(len(r) == 3 for r in rows)  # 41 tokens: 3 blocks, 2 of them shared
    assert rows[0][:2] == rows[1][:2] == rows[2][:2]
    own = [r[2] for r in rows]
    assert len(set(own)) == 3 and not set(own) & set(rows[0][:2])
    # 40 sequences: 40 own blocks + 2 shared fit in 63; without sharing 120 do not
    assert synthetic_step([(40, 1)] * 40, 16, BlockSource(64, 0), shared=32) is not None
    assert synthetic_step([(40, 1)] * 40, 16, BlockSource(64, 0)) is None


def test_block_source_scatters_the_blocks() -> None:
    rows = BlockSource(9, 0).take([3, 2])
    flat = rows[0] + rows[1]
    assert len(set(flat)) == 5 and 0 not in flat and flat != [1, 2, 3, 4, 5]


def test_a_point_with_its_own_request_ids_finds_its_rows_in_place() -> None:
    """Interleaved points that share request ids rewrite each other's block-table rows at
    every call; with ids of their own, a point's rows are written once, as a served
    request's are."""
    from pagesim.gpu.input_buffers import BlockTableRows

    def writes(prefixes: tuple[str, str]) -> list[int]:
        blocks = BlockSource(4096, 0)
        a = synthetic_step([(64, 1)] * 4, 16, blocks, request_prefix=prefixes[0])
        b = synthetic_step([(128, 1)] * 4, 16, blocks, request_prefix=prefixes[1])
        rows = BlockTableRows(64)
        counts = []
        for out in (a, b, a, b):
            before = rows.table.copy()
            for sr in out.scheduled:
                rows.row_index(sr.request.request_id, sr.block_ids)
            counts.append(int((rows.table != before).any(axis=1).sum()))
        return counts

    assert writes(("cal", "cal")) == [4, 4, 4, 4]
    assert writes(("cal0", "cal1")) == [4, 4, 0, 0]


def test_hybrid_synthetic_steps_give_one_row_per_kv_cache_group() -> None:
    """Window 40, block 8: a sequence of 60 cached tokens keeps its blocks from the first
    new token's window on (positions 21..) in the sliding group, all of them in the full
    group; no block is in two rows."""
    blocks = BlockSource(64, seed=0, group_windows=(40, None))
    out = synthetic_step([(60, 1), (10, 5)], 8, blocks)
    (s0, f0), (s1, f1) = (sr.block_ids for sr in out.scheduled)
    assert len(s0) == len(f0) == 8 and s0[:2] == [0, 0] and 0 not in s0[2:] + f0
    assert len(s1) == len(f1) == 2 and 0 not in s1 + f1
    ids = s0[2:] + f0 + s1 + f1
    assert len(ids) == len(set(ids))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-moe", "tiny-hybrid"])
def test_dry_run_calibration_and_serve_of_moe_and_hybrid_models(tmp_path, name: str) -> None:
    """The calibration and a served run, as the GPU session makes them, of an MoE model and
    of a hybrid one (served through the hybrid KV cache manager)."""
    from pagesim.gpu.serve import make_engine
    from pagesim.validate.serve import serve_workload
    from pagesim.validate.store import load_dict

    config = EngineConfig.create(
        model=name,
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        num_gpu_blocks_override=64,
    )
    grid = CalibrationGrid(
        block_sizes=(16,),
        full_block_sizes=(16,),
        decode_batches=(1, 2),
        decode_contexts=(16, 60),
        prefill_tokens=(48,),
        prefill_cached=(0,),
        mixed=(),
        multi_prefill=(),
        decode_shared=(),
        varlen_shared=(),
        decode_shared_spread=(),
        decode_spread=(),
        overhead_max_reqs=2,
        repeats=3,
    )
    res = run_calibration(
        config,
        grid,
        dtype=torch.float32,
        calibration_root=tmp_path,
        log=lambda m: None,
        device="cpu",
    )
    prof = Profile.load(res.directory)
    assert [(r.batch_size, r.context_len) for r in prof.decode] == [
        (1, 16),
        (1, 60),
        (2, 16),
        (2, 60),
    ]
    assert prof.prefill and all(r.step_time_ms > 0 for r in prof.decode + prof.prefill)
    load = load_dict("random", 3, 0, math.inf, 1.0, random_input_len=50, random_output_len=3)
    result, _ = serve_workload(config, res.model, 64, load, device="cpu")
    assert result["completed"] == 3 and not result["truncated"]
    manager = type(make_engine(config, 64).kv_cache_manager).__name__
    assert manager == ("HybridKVCacheManager" if name == "tiny-hybrid" else "KVCacheManager")
