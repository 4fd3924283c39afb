"""The analytical model's pricing of MoE steps and MLA attention (pagesim.cost.moe)."""

from __future__ import annotations

import pytest

from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.moe import MoELinear
from pagesim.specs import GPUSpec, ModelSpec

H200 = GPUSpec.from_name("h200")


def test_active_experts_grow_from_top_k_to_all() -> None:
    moe = MoELinear.of(ModelSpec.from_name("mixtral-8x7b"), 1)
    assert moe.active_experts(1) == pytest.approx(2.0)
    assert moe.active_experts(2) == pytest.approx(8 * (1 - 0.75**2))
    assert moe.active_experts(1000) == pytest.approx(8.0)


def test_moe_split_adds_up_to_the_spec() -> None:
    model = ModelSpec.from_name("qwen3-30b-a3b")
    moe = MoELinear.of(model, 1)
    embeddings = 2 * model.vocab_size * model.hidden_size
    total = moe.dense_params + moe.num_moe_layers * moe.num_experts * moe.expert_params
    assert total + embeddings == pytest.approx(model.num_params)


def test_small_moe_decode_reads_only_the_routed_experts() -> None:
    """Mixtral at batch 1 reads ~13B parameters (2 of 8 experts), not 47B; once a step's
    tokens touch every expert it reads them all, and a step never gets cheaper with more
    tokens."""
    cm = AnalyticalCostModel(ModelSpec.from_name("mixtral-8x7b"), H200)
    dense = AnalyticalCostModel(ModelSpec.from_name("llama-2-13b"), H200)
    one, many = cm.decode_time(1, 512), cm.decode_time(256, 512)
    assert one < 1.2 * dense.decode_time(1, 512)
    assert many > 3 * one
    times = [cm.decode_time(b, 512) for b in (1, 2, 4, 8, 16, 32, 64, 128)]
    assert times == sorted(times)


def test_mxfp4_experts_read_fewer_bytes() -> None:
    oss = ModelSpec.from_name("gpt-oss-20b")
    bf16 = ModelSpec(**{**oss.__dict__, "expert_bytes_per_param": None})
    assert AnalyticalCostModel(oss, H200).decode_time(64, 512) < AnalyticalCostModel(
        bf16, H200
    ).decode_time(64, 512)


def test_mla_reads_the_latent_not_the_heads() -> None:
    ds = ModelSpec.from_name("deepseek-v2-lite")
    cm = AnalyticalCostModel(ds, H200)
    assert cm.kv_bytes_per_token == ds.num_layers * (512 + 64) * 2
    as_mha = ModelSpec(**{**ds.__dict__, "kv_lora_rank": None})
    long_decode = (256, 32768)
    assert cm.decode_time(*long_decode) < AnalyticalCostModel(as_mha, H200).decode_time(
        *long_decode
    )


def test_dense_models_are_priced_as_before() -> None:
    """No MoE or MLA field set: the dense path (one roofline over all weights)."""
    cm = AnalyticalCostModel(ModelSpec.from_name("llama-2-7b"), H200)
    assert cm._moe is None and cm._prefill_attn_s_per_qk == cm._attn_s_per_qk


def test_padded_moe_decode_is_priced_by_its_real_rows_plus_the_padding_token() -> None:
    """Under CUDA graphs a dense model's padded decode step has its graph's `other` (the
    weights read at P rows); an MoE model's padding rows route one token, so the `other` of 5
    sequences in the graph of 8 lies between those of 4 and 8 (the shipped H200 profiles)."""
    from pagesim.cost.base import BatchShape
    from pagesim.cost.calibrated import CalibratedCostModel
    from pagesim.cost.profile import Profile
    from pagesim.data import calibration_dir

    def other(model: str, batch: int) -> float:
        cost = CalibratedCostModel(Profile.load(calibration_dir() / "h200" / model))
        assert cost.padded_batch(5) == 8
        return cost.step_time_breakdown(BatchShape.decode(batch, 1024, 16))["other"]

    assert other("llama-2-7b", 5) == other("llama-2-7b", 8)
    moe = [other("qwen3-30b-a3b", b) for b in (4, 5, 6, 8)]
    assert moe[0] < moe[1] < moe[2] < moe[3]
