"""The fused-MoE grouped GEMM against a dense fp32 reference (every expert on every token),
and the alignment it runs on: exact sorted pair ids and tile experts for a small routing."""

from __future__ import annotations

import pytest
import torch

from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.fused_moe import (
    MoEConfig,
    fused_moe,
    fused_moe_reference,
    max_num_tiles,
    moe_align,
    route,
)

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3}


def _weights(gen, e: int, h: int, i: int, dtype: torch.dtype, device: str):
    w13 = (torch.randn(e, 2 * i, h, generator=gen) * 0.1).to(dtype).to(device)
    w2 = (torch.randn(e, h, i, generator=gen) * 0.1).to(dtype).to(device)
    return w13, w2


def _check(x, w13, w2, weights, ids, dtype, config=None) -> None:
    out = fused_moe(x, w13, w2, weights, ids, config)
    ref = fused_moe_reference(x, w13, w2, weights, ids)
    assert out.dtype == x.dtype and out.shape == x.shape
    err = float((out.float() - ref).norm() / ref.norm())
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


def test_alignment_groups_pairs_by_expert_in_whole_tiles() -> None:
    # tokens 0..2 pick (3, 5), (5, 3), (3, 0): expert 0 gets pair 5, 3 gets 0, 3, 4, 5 gets 1, 2
    ids = torch.tensor([[3, 5], [5, 3], [3, 0]], dtype=torch.int32)
    a = moe_align(ids, num_experts=8, block_m=4)
    pad = 6  # = number of pairs
    assert a.sorted_pair_ids.tolist()[:12] == [5, pad, pad, pad, 0, 3, 4, pad, 1, 2, pad, pad]
    assert set(a.sorted_pair_ids.tolist()[12:]) == {pad}
    assert len(a.tile_expert) == max_num_tiles(6, 8, 4) == 6
    assert a.tile_expert.tolist()[:3] == [0, 3, 5]
    assert a.num_padded.tolist() == [12]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("t", "e", "k", "h", "i"),
    [(1, 8, 2, 64, 32), (37, 8, 2, 128, 64), (6, 4, 4, 48, 40), (20, 16, 1, 32, 96)],
)
def test_fused_moe_matches_dense_reference(device, gen, dtype, t, e, k, h, i) -> None:
    """T=1 (most experts idle), uneven expert loads, H and I off the tile sizes, top-1."""
    x = torch.randn(t, h, generator=gen).to(dtype).to(device)
    w13, w2 = _weights(gen, e, h, i, dtype, device)
    weights, ids = route(torch.randn(t, e, generator=gen).to(device), k)
    _check(x, w13, w2, weights, ids, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_idle_experts_and_one_crowded_expert(device, gen, dtype) -> None:
    """Every token's first choice is expert 2 (a run of several tiles); experts 0, 1, 3..5
    get nothing; block_m 16 with 19 rows on one expert crosses a tile edge."""
    t, e, h, i = 19, 8, 64, 32
    x = torch.randn(t, h, generator=gen).to(dtype).to(device)
    w13, w2 = _weights(gen, e, h, i, dtype, device)
    ids = torch.stack([torch.full((t,), 2), 6 + torch.arange(t) % 2], dim=1).to(torch.int32)
    weights = torch.softmax(torch.randn(t, 2, generator=gen), -1)
    _check(x, w13, w2, weights.to(device), ids.to(device), dtype, MoEConfig(16, 32, 32, 4, 1))


def test_tied_router_logits_pick_distinct_experts_with_equal_weights(device, gen) -> None:
    """All logits equal: top-k still names k distinct experts, each weighted 1/k, and the
    kernel computes what the reference does for them."""
    t, e, k, h, i = 5, 8, 2, 32, 32
    weights, ids = route(torch.zeros(t, e, device=device), k)
    assert torch.allclose(weights, torch.full((t, k), 1 / k, device=device))
    assert all(len(set(row)) == k for row in ids.tolist())
    x = torch.randn(t, h, generator=gen).to(device)
    w13, w2 = _weights(gen, e, h, i, torch.float32, device)
    _check(x, w13, w2, weights, ids, torch.float32)


def test_routing_is_softmax_then_top_k_renormalised() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    weights, ids = route(logits, 2)
    assert ids.tolist() == [[1, 2]]
    p = torch.softmax(logits, -1)[0].tolist()
    assert weights[0].tolist() == pytest.approx([p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])])


def test_bad_shapes_are_refused() -> None:
    x = torch.zeros(3, 32)
    w13, w2 = torch.zeros(4, 64, 32), torch.zeros(4, 32, 32)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(KernelInputError, match="w2.shape"):
        fused_moe(x, w13, torch.zeros(4, 32, 16), torch.ones(3, 2), ids)
    with pytest.raises(KernelInputError, match="topk_weights.shape"):
        fused_moe(x, w13, w2, torch.ones(3, 1), ids)
    with pytest.raises(KernelInputError, match="w13.dtype"):
        fused_moe(x, w13.half(), w2, torch.ones(3, 2), ids)
