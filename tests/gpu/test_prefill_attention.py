"""Prefill / chunked-prefill / mixed-step paged attention against the fp32 torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_references import paged_attention_prefill_reference
from paged_kv_helpers import PagedKV, assert_close_rel, randn

from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.configs import KernelConfig, prefill_config
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill
from pagesim.kvcache.block_table import build_query_start_loc

# (cached prefix, new tokens) per sequence: a fresh prompt, a chunk on a cached prefix, a
# decode mixed into the batch, a one-token prompt, a chunk that starts mid-block.
MIXED = [(0, 9), (13, 5), (20, 1), (0, 1), (3, 17)]


def _run(
    gen,
    device,
    dtype,
    seqs,
    num_heads,
    num_kv_heads,
    head_size,
    block_size,
    window=None,
    config=None,
    pad_rows=0,
):
    seq_lens = [c + n for c, n in seqs]
    kv = PagedKV(gen, seq_lens, block_size, num_kv_heads, head_size, dtype, device)
    qsl = torch.tensor(
        build_query_start_loc([n for _, n in seqs]), dtype=torch.int32, device=device
    )
    num_tokens = int(qsl[-1]) + pad_rows
    query = randn(gen, (num_tokens, num_heads, head_size), dtype, device)
    out = torch.full_like(query, float("nan"))  # poison: every real row must be written
    paged_attention_prefill(
        query,
        kv.key_cache,
        kv.value_cache,
        kv.block_table,
        kv.seq_lens,
        qsl,
        sliding_window=window,
        out=out,
        config=config,
    )
    ref = paged_attention_prefill_reference(
        query, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, qsl, sliding_window=window
    )
    n = int(qsl[-1])
    return out[:n], ref[:n], out[n:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 1), (6, 2)])
@pytest.mark.parametrize("block_size", [8, 16])
def test_mixed_batch_matches_reference(gen, device, dtype, num_heads, num_kv_heads, block_size):
    out, ref, _ = _run(gen, device, dtype, MIXED, num_heads, num_kv_heads, 64, block_size)
    assert_close_rel(out, ref, dtype)


@pytest.mark.parametrize("window", [1, 4, 11])
def test_sliding_window(gen, device, window):
    seqs = [(0, 23), (19, 6), (30, 1)]
    out, ref, _ = _run(gen, device, torch.float32, seqs, 4, 2, 64, 8, window=window)
    assert_close_rel(out, ref, torch.float32)


@pytest.mark.parametrize("head_size,block_size", [(128, 32), (256, 64), (64, 128)])
def test_head_and_block_sizes(gen, device, head_size, block_size):
    out, ref, _ = _run(gen, device, torch.float16, [(5, 12), (0, 3)], 2, 1, head_size, block_size)
    assert_close_rel(out, ref, torch.float16)


def test_query_blocks_wider_than_group(gen, device):
    # 32 rows per program with 3 query heads per KV head: 10 tokens a block, row 30-31 idle,
    # several query blocks per sequence.
    cfg = KernelConfig(block_m=32, tile_n=16, num_warps=4, num_stages=1)
    out, ref, _ = _run(
        gen, device, torch.float16, [(4, 25), (0, 11), (7, 1)], 6, 2, 64, 16, config=cfg
    )
    assert_close_rel(out, ref, torch.float16)


def test_random_batches(gen, device):
    """Random mixes of prefixes, chunk lengths, groups, blocks, windows and tiles (fp32)."""

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    for _ in range(4):
        heads, kv_heads = pick([(2, 2), (4, 1), (6, 2), (8, 4)])
        n = int(torch.randint(1, 4, (1,), generator=gen))
        seqs = [
            (int(c), int(q))
            for c, q in zip(
                torch.randint(0, 40, (n,), generator=gen),
                torch.randint(1, 30, (n,), generator=gen),
                strict=True,
            )
        ]
        cfg = KernelConfig(pick([16, 32]), 16, 4, 1)
        if cfg.block_m < heads // kv_heads:
            cfg = cfg._replace(block_m=16)
        out, ref, _ = _run(
            gen,
            device,
            torch.float32,
            seqs,
            heads,
            kv_heads,
            64,
            pick([8, 16, 32]),
            window=pick([None, 1, 5, 17]),
            config=cfg,
        )
        assert_close_rel(out, ref, torch.float32)


def test_padding_rows_are_left_alone(gen, device):
    _, _, pad = _run(gen, device, torch.float16, [(2, 5), (0, 3)], 2, 2, 64, 8, pad_rows=4)
    assert pad.isnan().all()


def test_config_rule():
    assert prefill_config(128, 4, on_gpu=True).block_m % 4 == 0
    assert prefill_config(128, 32, on_gpu=True).block_m >= 32
    assert prefill_config(64, 1, on_gpu=False).block_m == 16


def test_bad_inputs_raise_one_line_errors(gen, device):
    kv = PagedKV(gen, [5, 7], 8, 2, 64, torch.float16, device)
    q = randn(gen, (12, 2, 64), torch.float16, device)
    qsl = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    args = (kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens)
    cases = [
        (lambda: paged_attention_prefill(q, *args, qsl[:2]), "query_start_loc.shape"),
        (lambda: paged_attention_prefill(q, *args, qsl.float()), "query_start_loc.dtype"),
        (lambda: paged_attention_prefill(q[:, :, :32], *args, qsl), "query.shape"),
        (
            lambda: paged_attention_prefill(
                q, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens[:1], qsl
            ),
            "seq_lens.shape",
        ),
    ]
    for call, needle in cases:
        with pytest.raises(KernelInputError) as info:
            call()
        assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [(32, 8, 128, 16), (16, 16, 128, 32), (8, 2, 256, 64), (12, 4, 64, 8)],
)
def test_prefill_large_gpu(gen, dtype, num_heads, num_kv_heads, head_size, block_size):
    seqs = [(0, 1500), (2048, 700), (0, 1), (4000, 1), (317, 1029), (0, 64)]
    for window in (None, 512):
        out, ref, _ = _run(
            gen,
            "cuda",
            dtype,
            seqs,
            num_heads,
            num_kv_heads,
            head_size,
            block_size,
            window=window,
            pad_rows=16,
        )
        assert_close_rel(out, ref, dtype)
