"""CUDA graphs of decode and mixed steps (`pagesim.gpu.cuda_graphs`).

On a CPU the padded static-buffer path runs eagerly (`capture=False`): the very buffers a graph
replay reads (batch or tokens padded to a captured size, fixed-width block table, PAD_SLOT_ID
slots, seq_len 0 rows, padded sequences owning no rows, the bucketed split-K partition) against
the unpadded eager path of a second runner with the same weights, step by step on the same
schedule: same final hidden rows, same K/V written, nothing written for padding rows. The real
capture and replay is the `gpu` test.
"""

from __future__ import annotations

import pytest
import torch

from pagesim.config import EngineConfig
from pagesim.gpu.cuda_graphs import (
    CAPTURE_SIZES,
    GraphKey,
    capture_sizes,
    span_bucket,
)
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
from pagesim.gpu.serve import make_engine
from pagesim.kvcache.block_table import build_block_table, build_positions, build_slot_mapping
from pagesim.request import Request
from tests.scheduler.sched_helpers import apply_block_ids


def _config(**kw) -> EngineConfig:
    base = dict(
        model="tiny-llama",
        gpu="h200",
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=128,
        max_model_len=256,
    )
    base.update(kw)
    return EngineConfig.create(**base)


def _requests() -> list[Request]:
    # 3 sequences: a decode batch of 3 pads to 4 (2 after the first finishes). Contexts stay
    # below 128 tokens, so the eager step runs unsplit while the static path uses the split-K
    # partition of its 256-token span bucket.
    prompts = [list(range(1, 40)), list(range(300, 320)), list(range(50, 61))]
    return [
        Request(f"r{i}", p, max_tokens=m)
        for i, (p, m) in enumerate(zip(prompts, [6, 3, 5], strict=True))
    ]


def _check_staged_inputs(graphs, scheduled, block_size: int, kept: dict) -> None:
    """The device buffers of a graph step hold what the core's functions build from the
    step's rows (rows kept across steps and staged in one copy must not drift from them);
    `kept` holds every request's row, rebuilt from the steps' block-id deltas."""
    rows = [list(apply_block_ids(kept, sr)) for sr in scheduled]
    starts = [sr.num_computed_tokens for sr in scheduled]
    news = [sr.num_new_tokens for sr in scheduled]
    t = sum(news)
    assert graphs.block_table[: len(rows)].tolist() == build_block_table(rows, graphs.width)
    assert graphs.pack[1, :t].tolist() == build_positions(starts, news)
    assert graphs.pack[2, :t].tolist() == build_slot_mapping(rows, starts, news, block_size)
    assert graphs.seq_lens[: len(rows)].tolist() == [
        s + n for s, n in zip(starts, news, strict=True)
    ]


def test_capture_sizes_cover_every_batch() -> None:
    assert capture_sizes(1024) == CAPTURE_SIZES
    assert capture_sizes(3) == (1, 2, 3)
    assert capture_sizes(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100)
    assert capture_sizes(1024, max_size=64)[-1] == 64


def test_span_bucket_is_a_power_of_two_within_limits() -> None:
    assert span_bucket(1, 4096) == 256
    assert span_bucket(257, 4096) == 512
    assert span_bucket(4096, 4096) == 4096
    assert span_bucket(3000, 3500) == 3500  # capped at max_model_len, never below the step


@pytest.mark.slow
def test_static_padded_path_equals_unpadded_eager_path() -> None:
    cfg = _config()
    blocks = 64
    eager = GPUModelRunner(
        cfg, blocks, RunnerConfig(device="cpu", dtype=torch.float32, seed=3, temperature=0.0)
    )
    static = GPUModelRunner(
        cfg,
        blocks,
        RunnerConfig(
            device="cpu", dtype=torch.float32, seed=3, temperature=0.0, capture_graphs=False
        ),
    )
    assert eager.graphs is None  # no graphs on a CPU unless asked for uncaptured ones
    scheds = [make_engine(cfg, blocks), make_engine(cfg, blocks)]
    for s in scheds:
        for r in _requests():
            s.add_request(r)
    keys: set[GraphKey] = set()
    kept: dict = {}
    padded_steps = 0
    mixed_steps = 0
    eager_unsplit = 0
    for step in range(40):
        if not scheds[0].has_unfinished_requests():
            break
        outs = [s.schedule() for s in scheds]
        assert [
            (x.request_id, x.num_new_tokens, x.num_computed_tokens, x.block_ids)
            for x in outs[0].scheduled
        ] == [
            (x.request_id, x.num_new_tokens, x.num_computed_tokens, x.block_ids)
            for x in outs[1].scheduled
        ]
        res = [eager.execute_model(outs[0]), static.execute_model(outs[1])]
        assert res[0].sampled_token_ids == res[1].sampled_token_ids
        rec = static.step_records[-1]
        decode_only = all(x.num_new_tokens == 1 for x in outs[1].scheduled)
        _check_staged_inputs(static.graphs, outs[1].scheduled, cfg.block_size, kept)
        assert rec.cuda_graph, f"step {step}"  # every step fits the 128-token budget
        assert rec.mixed_graph == (not decode_only)
        assert not eager.step_records[-1].cuda_graph
        if not decode_only:
            mixed_steps += 1
            key = static.graphs.key_for(outs[1].scheduled)
            n, t, s = rec.num_reqs, rec.num_tokens, rec.padded_reqs
            assert key.mixed and rec.padded_tokens == key.size >= t
            assert s == min(key.size, static.graphs.max_seqs) >= n
            g = static.graphs
            assert g.pack[2, t : key.size].eq(-1).all()  # padded rows write nothing
            assert g.seq_lens[n:s].eq(0).all() and g.block_table[n:s].eq(0).all()
            assert g.mixed_query_start_loc[n : s + 1].eq(t).all()  # padded seqs own no rows
        if decode_only:
            key = static.graphs.key_for(outs[1].scheduled)
            keys.add(key)
            assert rec.padded_reqs == key.size >= rec.num_reqs
            padded_steps += rec.padded_reqs > rec.num_reqs
            eager_unsplit += eager.last_inputs.metadata.decode_partition.num_partitions == 1
            # the static buffers hold the step, padding rows after it
            n, p = rec.num_reqs, rec.padded_reqs
            assert static.graphs.pack[2, n:p].eq(-1).all()
            assert static.graphs.seq_lens[n:p].eq(0).all()
            assert static.graphs.block_table[n:p].eq(0).all()
        err = (static.last_hidden - eager.last_hidden).abs().max().item()
        assert static.last_hidden.shape == eager.last_hidden.shape
        assert err < 1e-4, f"step {step}: hidden rows differ by {err:.2e}"
        for (ka, va), (kb, vb) in zip(eager.kv_caches, static.kv_caches, strict=True):
            assert torch.allclose(ka, kb, atol=1e-5) and torch.allclose(va, vb, atol=1e-5)
            assert kb[0].eq(0).all() and vb[0].eq(0).all()  # the null block stays untouched
        for s, o, r in zip(scheds, outs, res, strict=True):
            s.update_from_output(o, r)
    assert not scheds[0].has_unfinished_requests()
    assert padded_steps >= 1  # 3 sequences ran in the size-4 buffers
    assert mixed_steps >= 1  # the prefill step ran through the mixed graph's buffers
    assert any(k.num_partitions > 1 for k in keys)  # the bucket's split-K partition ran
    assert eager_unsplit >= 1  # against an unsplit eager step: same result


def test_static_path_skips_attention_for_calibration() -> None:
    cfg = _config()
    runner = GPUModelRunner(
        cfg,
        32,
        RunnerConfig(
            device="cpu", dtype=torch.float32, seed=1, temperature=0.0, capture_graphs=False
        ),
    )
    from pagesim.gpu.calibrate import BlockSource, synthetic_step

    out = synthetic_step([(40, 1)] * 3, 16, BlockSource(32, 0))
    runner.skip_attention = True
    runner.execute_model(out)
    before = [k.clone() for k, _ in runner.kv_caches]
    rec = runner.step_records[-1]
    assert rec.cuda_graph and rec.padded_reqs == 4
    assert runner.graphs.key_for(out.scheduled, True) == GraphKey(4, 1, 0, True)
    assert all(torch.equal(a, k) for a, (k, _) in zip(before, runner.kv_caches, strict=True))


def test_steps_larger_than_the_largest_size_run_eagerly() -> None:
    cfg = _config(max_num_seqs=2)
    runner = GPUModelRunner(cfg, 32, RunnerConfig(device="cpu", dtype=torch.float32))
    graphs = runner.make_graphs(capture=False)
    from pagesim.gpu.calibrate import BlockSource, synthetic_step

    out = synthetic_step([(20, 1)] * 3, 16, BlockSource(32, 0))
    assert graphs.key_for(out.scheduled) is None
    mixed = synthetic_step([(20, 1), (0, 8)], 16, BlockSource(32, 0))
    assert graphs.key_for(mixed.scheduled) == GraphKey(16, 1, 0, False, True)
    big = synthetic_step([(0, 129)], 16, BlockSource(32, 0))  # above the 128-token budget
    assert graphs.key_for(big.scheduled) is None
    decode_only = runner.make_graphs(capture=False)
    decode_only.token_sizes = ()  # no mixed graphs
    assert decode_only.key_for(mixed.scheduled) is None


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-hybrid"])
def test_graph_replay_matches_eager_on_the_gpu(model: str) -> None:
    """Real capture: same hidden rows as eager (bf16 tolerance), graphs replayed, every key of
    the run captured up front by capture_all, a second replay of a key reuses its graph; the
    hybrid model with one table per KV cache group, its contexts past the window."""
    cfg = _config(model=model, max_num_seqs=16)
    blocks = 64
    eager = GPUModelRunner(
        cfg,
        blocks,
        RunnerConfig(
            device="cuda", dtype=torch.bfloat16, seed=3, temperature=0.0, cuda_graphs=False
        ),
    )
    graphed = GPUModelRunner(
        cfg, blocks, RunnerConfig(device="cuda", dtype=torch.bfloat16, seed=3, temperature=0.0)
    )
    assert eager.graphs is None and graphed.graphs is not None
    n, secs = graphed.graphs.capture_all()
    assert graphed.graphs.failed is None and n == len(graphed.graphs.all_keys()) and secs > 0
    scheds = [make_engine(cfg, blocks), make_engine(cfg, blocks)]
    for s in scheds:
        for r in _requests():
            s.add_request(r)
    replayed = 0
    while scheds[0].has_unfinished_requests():
        outs = [s.schedule() for s in scheds]
        res = [eager.execute_model(outs[0]), graphed.execute_model(outs[1])]
        rec = graphed.step_records[-1]
        replayed += rec.cuda_graph
        assert not rec.graph_captured
        err = (
            graphed.last_hidden.float() - eager.last_hidden.float()
        ).norm() / eager.last_hidden.float().norm()
        assert err < 2e-2
        for s, o, r in zip(scheds, outs, res, strict=True):
            s.update_from_output(o, r)
    assert replayed >= 5


@pytest.mark.slow
def test_graph_vs_eager_rows_switch_modes_and_compare_outputs() -> None:
    from pagesim.gpu.graph_check import graph_vs_eager_rows

    runner = GPUModelRunner(
        _config(),
        32,
        RunnerConfig(
            device="cpu", dtype=torch.float32, seed=2, temperature=0.0, capture_graphs=False
        ),
    )
    graphs = runner.graphs
    switched = []

    def use_graphs(on: bool) -> None:
        switched.append(on)
        runner.graphs = graphs if on else None

    shapes = {
        "decode 3x40": [(40, 1)] * 3,
        "chunk with decodes": [(40, 1)] * 2 + [(0, 24)],
        "too big for the cache": [(0, 600)],
    }
    rows = graph_vs_eager_rows(runner, use_graphs, shapes, reps=2)
    assert [r["shape"] for r in rows] == ["decode 3x40", "chunk with decodes"]
    for r in rows:
        assert r["hidden_rel_diff"] < 1e-5 and r["graph_failed"] is None
        assert 0 < r["graph_ms"] <= r["graph_ms_p90"] and 0 < r["eager_ms"] <= r["eager_ms_p90"]
    # (2 warm-ups + 2 timed) x 2 modes per shape, alternating; graphs back on at the end
    assert switched == ([True, False] * 4 + [True]) * 2 and runner.graphs is graphs
    modes = [rec.cuda_graph for rec in runner.step_records]
    assert modes == [True, False] * 8  # the static path ran exactly when graphs were on
    assert runner.step_records[0].padded_reqs == 4  # 3 decodes padded to the size-4 buffers


@pytest.mark.slow
def test_graph_and_eager_decode_splits_are_reported_and_explain_the_outputs() -> None:
    """A decode graph splits contexts for its span bucket, an eager step for its longest
    context. Where both cut contexts at the same offsets the two are bit-identical; where
    the cuts differ the split-K reduction sums in another order (rounding, not an error)."""
    from pagesim.gpu.graph_check import graph_vs_eager_rows

    runner = GPUModelRunner(
        _config(),
        64,
        RunnerConfig(
            device="cpu", dtype=torch.float32, seed=2, temperature=0.0, capture_graphs=False
        ),
    )
    graphs = runner.graphs

    def use_graphs(on: bool) -> None:
        runner.graphs = graphs if on else None

    shapes = {
        "short": [(40, 1)] * 2,
        "cut apart": [(150, 1)] * 2,
        "cut alike": [(254, 1)] * 2,
        "not decode-only": [(40, 1), (0, 8)],
    }
    rows = {r["shape"]: r for r in graph_vs_eager_rows(runner, use_graphs, shapes, reps=1)}
    assert {
        k: (r["eager_split"], r["graph_split"], r["same_split"])
        for k, r in rows.items()
        if "same_split" in r
    } == {
        "short": ("1", "2x128", True),
        "cut apart": ("2x80", "2x128", False),
        "cut alike": ("2x128", "2x128", True),
    }
    assert "same_split" not in rows["not decode-only"]
    assert rows["short"]["hidden_rel_diff"] == 0.0 == rows["cut alike"]["hidden_rel_diff"]
    assert 0.0 < rows["cut apart"]["hidden_rel_diff"] < 1e-5


def test_partition_cuts() -> None:
    from pagesim.cost.decode_launch import DecodePartition, partition_cuts

    assert partition_cuts(DecodePartition(1, 4096), 3000) == ()
    # llama-3-70b at TP 2, 64 sequences of 513 tokens: eager 2 x 320, graph 2 x 512
    assert partition_cuts(DecodePartition(2, 320), 513) == (320,)
    assert partition_cuts(DecodePartition(2, 512), 513) == (512,)
    # 5 x 128 eagerly and 8 x 128 in the graph cut alike: the graph's last three are empty
    assert (
        partition_cuts(DecodePartition(5, 128), 513)
        == partition_cuts(DecodePartition(8, 128), 513)
        == (128, 256, 384, 512)
    )


@pytest.mark.slow
def test_mixed_graph_steps_equal_eager_ones_for_an_odd_query_group() -> None:
    """Seven query heads per KV head (qwen2.5-7b's group): the padded mixed path (decodes
    beside a chunk, tokens and sequences padded) computes exactly what the eager step does,
    so a difference on the GPU comes from the GEMMs' row count, not from the graph path."""
    import dataclasses

    from pagesim.gpu.graph_check import graph_vs_eager_rows
    from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder

    config = _config()
    spec = dataclasses.replace(
        config.model_spec,
        name="tiny-gqa7",
        num_attention_heads=7,
        num_kv_heads=1,
        hidden_size=7 * 32,
    )
    model = RandomWeightDecoder(DecoderConfig(spec, torch.float32, "cpu", 16, seed=3))
    runner = GPUModelRunner(
        config,
        64,
        RunnerConfig(
            device="cpu", dtype=torch.float32, seed=2, temperature=0.0, capture_graphs=False
        ),
        model=model,
    )
    graphs = runner.graphs

    def use_graphs(on: bool) -> None:
        runner.graphs = graphs if on else None

    shapes = {"3 decodes + chunk 24": [(100, 1)] * 3 + [(0, 24)]}
    (row,) = graph_vs_eager_rows(runner, use_graphs, shapes, reps=1)
    assert row["hidden_rel_diff"] == 0.0
    first = runner.step_records[0]  # the graph path really ran, padded: 27 tokens in 32
    assert first.mixed_graph and (first.padded_tokens, first.num_tokens) == (32, 27)
