"""The roofline model: hand-computed values, every term's direction, monotonicity."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.cost.analytical import (
    BREAKDOWN_KEYS,
    AnalyticalConstants,
    AnalyticalCostModel,
    matmul_params_per_layer,
)
from pagesim.cost.base import BatchShape
from pagesim.errors import ConfigError
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput
from pagesim.specs import GPUSpec, ModelSpec

TINY = ModelSpec(
    name="tiny",
    arch="llama",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=4,
    head_size=16,
    intermediate_size=128,
    vocab_size=100,
    max_position_embeddings=4096,
    num_params=0,
)
ROUND_GPU = GPUSpec(
    name="round",
    memory_bytes=10**10,
    hbm_bandwidth_bytes_per_s=1e12,
    fp16_flops=1e14,
    host_link_bytes_per_s=1e10,
    nvlink_bytes_per_s=1e11,
)
# every efficiency 1, every fixed cost 0: the bare roofline
BARE = AnalyticalConstants(
    weight_bandwidth_efficiency=1.0,
    gemm_flops_efficiency=1.0,
    attention_bandwidth_efficiency=1.0,
    attention_flops_efficiency=1.0,
    paged_block_overhead_tokens=0.0,
    per_layer_overhead_s=0.0,
    step_overhead_s=0.0,
    per_request_overhead_s=0.0,
    host_link_efficiency=1.0,
    allreduce_latency_s=0.0,
    allreduce_bandwidth_efficiency=1.0,
)

# Tiny model by hand: per layer q,k,v,o = 64*64*4 = 16384, MLP 3*64*128 = 24576 -> 40960;
# two layers 81920 plus lm_head 100*64 = 6400 -> weights 88320 * 2 bytes = 176640 bytes.
# KV per token: K and V, 2 layers, 4 heads, 16 dims, 2 bytes = 512 bytes.
WEIGHTS_S = 176640 / 1e12
GEMM_S_PER_TOKEN = 2 * 81920 / 1e14
LM_HEAD_S_PER_REQ = 2 * 6400 / 1e14
KV_S_PER_TOKEN = 512 / 1e12
ATTN_S_PER_QK = 4 * 2 * 4 * 16 / 1e14


def bare(**changes) -> AnalyticalCostModel:
    return AnalyticalCostModel(TINY, ROUND_GPU, constants=dataclasses.replace(BARE, **changes))


def test_matmul_params_of_the_tiny_model():
    assert matmul_params_per_layer(TINY) == 40960
    assert matmul_params_per_layer(dataclasses.replace(TINY, arch="opt")) == 16384 + 2 * 8192


def test_decode_by_hand_is_weight_bound_plus_kv_read():
    # 2 sequences over 10 cached tokens: attend 11 each (22 K/V tokens read), write 2
    expected = max(WEIGHTS_S, 2 * GEMM_S_PER_TOKEN + 2 * LM_HEAD_S_PER_REQ) + max(
        (22 + 2) * KV_S_PER_TOKEN, 22 * ATTN_S_PER_QK
    )
    assert expected == pytest.approx(1.7664e-7 + 1.2288e-8, rel=1e-12)
    assert bare().decode_time(2, 10) == pytest.approx(expected, rel=1e-12)


def test_prefill_by_hand_is_compute_bound():
    # 1000 new tokens, no prefix: GEMMs 1.638528 us, causal attention 1000*1001/2 QK pairs
    linear = 1000 * GEMM_S_PER_TOKEN + LM_HEAD_S_PER_REQ
    attention = max(2000 * KV_S_PER_TOKEN, 500500 * ATTN_S_PER_QK)
    assert linear + attention == pytest.approx(1.638528e-6 + 2.56256e-6, rel=1e-12)
    assert bare().prefill_time(1000) == pytest.approx(linear + attention, rel=1e-12)


def test_per_layer_time_is_paid_once_per_layer_by_any_step_that_runs_the_model():
    cm = bare(per_layer_overhead_s=100e-6)
    for shape in (
        BatchShape.decode(1, 10),
        BatchShape.decode(64, 10),
        BatchShape.prefill(1000),
        BatchShape.mixed(256, 0, 8, 100),
    ):
        assert cm.step_time_breakdown(shape)["layers"] == pytest.approx(2 * 100e-6)
        assert cm.step_time(shape) == pytest.approx(bare().step_time(shape) + 2e-4, rel=1e-12)
    assert (
        cm.step_time_breakdown(BatchShape(block_size=16, total_tokens=0, swap_bytes=10))["layers"]
        == 0.0
    )


def test_breakdown_sums_to_step_time_and_names_every_term(llama7b, h200):
    cm = AnalyticalCostModel(llama7b, h200)
    shape = BatchShape.mixed(512, 128, 64, 900)
    bd = cm.step_time_breakdown(shape)
    assert tuple(bd) == BREAKDOWN_KEYS
    assert sum(bd.values()) == pytest.approx(cm.step_time(shape), rel=1e-12)


def test_overhead_is_per_step_plus_per_request():
    cm = bare(step_overhead_s=1e-3, per_request_overhead_s=5e-6)
    assert cm.step_time_breakdown(BatchShape.decode(8, 10))["overhead"] == pytest.approx(1.04e-3)


def test_paged_block_term_by_hand_and_direction():
    # 22 K/V tokens in 2 sequences, block 16: 22/16 + 2 * 15/32 = 2.3125 blocks in expectation,
    # each costing 4 tokens' worth of K/V reads
    cm = bare(paged_block_overhead_tokens=4.0)
    bd = cm.step_time_breakdown(BatchShape.decode(2, 10, block_size=16))
    assert bd["paged_blocks"] == pytest.approx(2.3125 * 4 * KV_S_PER_TOKEN, rel=1e-12)
    times = [cm.decode_time(32, 2000, block_size=b) for b in (1, 4, 8, 16, 32, 128)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_block_size_never_speeds_up_compute_bound_prefill(llama7b, h200):
    cm = AnalyticalCostModel(llama7b, h200)
    times = [cm.prefill_time(4096, 0, block_size=b) for b in (1, 8, 16, 64)]
    assert times == sorted(times, reverse=True)


def test_swap_term_is_bytes_over_the_host_link():
    cm = bare(host_link_efficiency=0.8)
    shape = BatchShape.decode(1, 10)
    shape.swap_bytes = 10**6
    assert cm.step_time_breakdown(shape)["swap"] == pytest.approx(1e6 / (1e10 * 0.8))
    assert cm.step_time(shape) == pytest.approx(cm.decode_time(1, 10) + 1.25e-4)


def test_copy_on_write_term_reads_and_writes_whole_blocks():
    shape = BatchShape.decode(1, 10, block_size=16)
    shape.num_blocks_to_copy = 3
    assert bare().step_time_breakdown(shape)["copy"] == pytest.approx(3 * 16 * 2 * 512 / 1e12)


def test_swap_only_step_costs_the_overhead_and_the_transfer():
    cm = bare(step_overhead_s=1e-3)
    shape = BatchShape(16, 0, swap_bytes=10**7)
    assert cm.step_time(shape) == pytest.approx(1e-3 + 1e-3)


def test_tensor_parallel_by_hand():
    # tp=2: weights, heads and KV heads halved; 2 all-reduces per layer (4 in all), each
    # 1 us + 2*(2-1)/2 * tokens * 64 hidden * 2 bytes / 1e11 B/s
    cm = AnalyticalCostModel(
        TINY,
        ROUND_GPU,
        tensor_parallel_size=2,
        constants=dataclasses.replace(BARE, allreduce_latency_s=1e-6),
    )
    bd = cm.step_time_breakdown(BatchShape.decode(2, 10))
    assert bd["linear"] == pytest.approx(WEIGHTS_S / 2, rel=1e-12)
    assert bd["attention"] == pytest.approx(24 * KV_S_PER_TOKEN / 2, rel=1e-12)
    assert bd["allreduce"] == pytest.approx(4 * (1e-6 + 1.0 * 2 * 64 * 2 / 1e11), rel=1e-12)


def test_tensor_parallel_speeds_up_big_steps_and_costs_small_ones(llama7b, h200):
    tp1 = AnalyticalCostModel(llama7b, h200)
    tp2 = AnalyticalCostModel(llama7b, h200, tensor_parallel_size=2)
    assert tp2.prefill_time(4096) < tp1.prefill_time(4096)
    assert tp2.decode_time(64, 2048) < tp1.decode_time(64, 2048)
    assert tp2.step_time_breakdown(BatchShape.decode(1, 10))["allreduce"] > 0
    assert tp1.step_time_breakdown(BatchShape.decode(1, 10))["allreduce"] == 0


def test_tensor_parallel_without_nvlink_uses_the_host_link(llama7b, h200):
    pcie = dataclasses.replace(h200, nvlink_bytes_per_s=0.0)
    shape = BatchShape.prefill(2048)
    slow = AnalyticalCostModel(llama7b, pcie, tensor_parallel_size=2).step_time_breakdown(shape)
    fast = AnalyticalCostModel(llama7b, h200, tensor_parallel_size=2).step_time_breakdown(shape)
    assert slow["allreduce"] > fast["allreduce"]


def test_fp8_kv_cache_halves_kv_reads(llama7b, h200):
    auto = AnalyticalCostModel(llama7b, h200).step_time_breakdown(BatchShape.decode(64, 2000))
    fp8 = AnalyticalCostModel(llama7b, h200, kv_cache_dtype="fp8").step_time_breakdown(
        BatchShape.decode(64, 2000)
    )
    assert fp8["attention"] == pytest.approx(auto["attention"] / 2, rel=1e-9)


def test_sliding_window_caps_the_context_read(llama7b, h200):
    windowed = dataclasses.replace(llama7b, sliding_window=1024)
    cm = AnalyticalCostModel(windowed, h200)
    assert cm.decode_time(8, 4000) == pytest.approx(cm.decode_time(8, 1024), rel=1e-3)
    assert AnalyticalCostModel(llama7b, h200).decode_time(8, 4000) > cm.decode_time(8, 4000)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(tensor_parallel_size=0), "tensor_parallel_size=0"),
        (dict(tensor_parallel_size=3), "tensor_parallel_size=3"),
        (dict(kv_cache_dtype="int3"), "kv_cache_dtype='int3'"),
    ],
)
def test_bad_settings_raise_one_line(llama7b, h200, kwargs, field):
    with pytest.raises(ConfigError, match=field) as err:
        AnalyticalCostModel(llama7b, h200, **kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "field, value",
    [
        ("gemm_flops_efficiency", 0.0),
        ("attention_bandwidth_efficiency", 1.5),
        ("step_overhead_s", -1.0),
        ("paged_block_overhead_tokens", float("nan")),
    ],
)
def test_bad_constants_are_rejected(field, value):
    with pytest.raises(ConfigError, match=field):
        AnalyticalConstants(**{field: value})


# ---- monotonicity ----
entries = st.lists(st.tuples(st.integers(1, 600), st.integers(0, 5000)), min_size=1, max_size=12)


def shape_of(pairs: list[tuple[int, int]], block_size: int = 16) -> BatchShape:
    sched = [ScheduledRequest(Request(str(i), [1], 1), n, c, []) for i, (n, c) in enumerate(pairs)]
    return BatchShape.from_scheduler_output(
        SchedulerOutput(0, sched, sum(n for n, _ in pairs), block_size=block_size)
    )


@settings(max_examples=60, deadline=None)
@given(
    pairs=entries,
    which=st.integers(0, 11),
    more_new=st.integers(0, 300),
    more_ctx=st.integers(0, 3000),
)
def test_more_tokens_or_longer_context_is_never_faster(
    llama7b, h200, pairs, which, more_new, more_ctx
):
    cm = AnalyticalCostModel(llama7b, h200)
    i = which % len(pairs)
    n, c = pairs[i]
    base = cm.step_time(shape_of(pairs))
    grown = pairs[:i] + [(n + more_new, c + more_ctx)] + pairs[i + 1 :]
    assert cm.step_time(shape_of(grown)) >= base
    assert cm.step_time(shape_of(pairs + [(1, 100)])) >= base  # one more request


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 512), extra=st.integers(1, 512), context=st.integers(1, 8000))
def test_bigger_decode_batch_is_cheaper_per_token(llama7b, h200, batch, extra, context):
    cm = AnalyticalCostModel(llama7b, h200)
    small, big = cm.decode_time(batch, context), cm.decode_time(batch + extra, context)
    assert big >= small
    assert big / (batch + extra) <= small / batch * (1 + 1e-12)
