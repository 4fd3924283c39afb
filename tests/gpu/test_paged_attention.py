"""Decode paged attention (split and unsplit) against the fp32 torch reference."""

from __future__ import annotations

import pytest
import torch
from kernel_references import paged_attention_decode_reference
from paged_kv_helpers import PagedKV, assert_close_rel, randn

from pagesim.cost.decode_launch import split_rule
from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.configs import (
    MAX_PARTITIONS,
    MIN_PARTITION_TOKENS,
    DecodePartition,
    KernelConfig,
    decode_config,
    decode_partition,
    fixed_partition,
)
from pagesim.gpu.kernels.paged_attention import paged_attention_decode

UNSPLIT = None  # partition chosen as one partition covering the longest context
SPLIT_3 = 3  # about three partitions of the longest context


def _run(kv: PagedKV, query, partition_hint, window=None, scale=None, small_tile=True):
    """Decode with about `partition_hint` partitions (None: one), checked for full writes.

    Small shapes use the interpreter's 16-token tile on the GPU too, so that their contexts
    still span several tiles and partitions there.
    """
    head_size, group = query.shape[2], query.shape[1] // kv.key_cache.shape[2]
    cfg = decode_config(head_size, group, on_gpu=query.is_cuda and not small_tile)
    span = int(kv.seq_lens.max())
    span = min(span, window) if window else span
    part = (
        DecodePartition(1, span)
        if partition_hint is UNSPLIT
        else fixed_partition(span, -(-span // partition_hint), cfg.tile_n)
    )
    out = torch.full_like(query, float("nan"))  # poison: every row must be written
    paged_attention_decode(
        query,
        kv.key_cache,
        kv.value_cache,
        kv.block_table,
        kv.seq_lens,
        part,
        scale=scale,
        sliding_window=window,
        out=out,
        config=cfg,
    )
    ref = paged_attention_decode_reference(
        query,
        kv.key_cache,
        kv.value_cache,
        kv.block_table,
        kv.seq_lens,
        scale=scale,
        sliding_window=window,
    )
    return out, ref, part


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 1), (6, 2)])
@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("split", [UNSPLIT, SPLIT_3])
def test_decode_matches_reference(gen, device, dtype, num_heads, num_kv_heads, block_size, split):
    # Ragged contexts: one token, a block boundary, a long one; permuted blocks, a wide table.
    seq_lens = [1, 2 * block_size, 61, 37]
    kv = PagedKV(gen, seq_lens, block_size, num_kv_heads, 64, dtype, device, table_width=10)
    query = randn(gen, (len(seq_lens), num_heads, 64), dtype, device)
    out, ref, part = _run(kv, query, split)
    assert (part.num_partitions > 1) == (split is not UNSPLIT)
    assert_close_rel(out, ref, dtype)


@pytest.mark.parametrize("head_size,block_size", [(128, 16), (256, 64), (64, 128)])
def test_decode_head_and_block_sizes(gen, device, head_size, block_size):
    seq_lens = [45, 3]
    kv = PagedKV(gen, seq_lens, block_size, 2, head_size, torch.float16, device)
    query = randn(gen, (2, 4, head_size), torch.float16, device)
    for split in (UNSPLIT, SPLIT_3):
        out, ref, _ = _run(kv, query, split, scale=0.3)
        assert_close_rel(out, ref, torch.float16)


@pytest.mark.parametrize("split", [UNSPLIT, SPLIT_3])
@pytest.mark.parametrize("window", [1, 10, 50])
def test_decode_sliding_window(gen, device, split, window):
    seq_lens = [70, 9, 33]
    kv = PagedKV(gen, seq_lens, 8, 1, 64, torch.float32, device)
    query = randn(gen, (3, 2, 64), torch.float32, device)
    out, ref, _ = _run(kv, query, split, window=window)
    assert_close_rel(out, ref, torch.float32)
    # The window changes the answer for the long sequence (the test can tell them apart).
    full = paged_attention_decode_reference(
        query, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens
    )
    assert not torch.allclose(full[0], ref[0], atol=1e-3)


@pytest.mark.parametrize("split", [UNSPLIT, SPLIT_3])
def test_empty_padded_sequence_gives_zeros(gen, device, split):
    kv = PagedKV(gen, [0, 40], 16, 2, 64, torch.float16, device)
    query = randn(gen, (2, 2, 64), torch.float16, device)
    out, ref, _ = _run(kv, query, split)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close_rel(out[1], ref[1], torch.float16)


def test_partition_rule():
    cfg = KernelConfig(16, 64, 4, 3, programs_per_sm=4)  # 528 programs resident on 132 SMs
    # Few programs, long context: split, partitions cover the context, multiples of the tile.
    p = decode_partition(1, 8, 8192, cfg, num_sms=132)
    assert p.num_partitions > 1 and p.partition_size % cfg.tile_n == 0
    assert p.partition_size >= MIN_PARTITION_TOKENS
    assert p.num_partitions * p.partition_size >= 8192 > (p.num_partitions - 1) * p.partition_size
    # Waves: 64 programs x 8 splits fill 528 slots once; 9 splits would start a second wave.
    assert decode_partition(8, 8, 8192, cfg, num_sms=132).num_partitions == 8
    assert decode_partition(32, 8, 2048, cfg, num_sms=132).num_partitions == 2
    # Enough programs already: no split.
    assert decode_partition(128, 32, 8192, cfg, num_sms=132).num_partitions == 1
    # Short contexts are not split below the minimum partition.
    assert decode_partition(1, 1, 300, cfg, num_sms=132).num_partitions <= 3
    assert decode_partition(1, 1, 10**6, cfg, num_sms=132).num_partitions <= MAX_PARTITIONS
    # A sliding window bounds the span that is split.
    assert decode_partition(1, 8, 100_000, cfg, 132, sliding_window=512).num_partitions <= 4
    # The cost model prices with the very rule the backend launches with.
    for b, h, span in [(1, 8, 8192), (16, 32, 4096), (24, 32, 4096), (64, 8, 3000)]:
        assert decode_partition(b, h, span, cfg, 132) == split_rule(b, h, span, 64, 4, 132)


def test_random_shapes(gen, device):
    """Random ragged batches, group sizes, block sizes, windows and splits (fp32)."""
    for _ in range(4):
        heads, kv_heads = [(2, 2), (4, 1), (6, 2), (8, 4)][
            int(torch.randint(4, (1,), generator=gen))
        ]
        block_size = [8, 16, 32][int(torch.randint(3, (1,), generator=gen))]
        seq_lens = torch.randint(
            0, 90, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen
        ).tolist()
        seq_lens[0] = max(seq_lens[0], 1)
        window = [None, None, 1, 7, 40][int(torch.randint(5, (1,), generator=gen))]
        kv = PagedKV(gen, seq_lens, block_size, kv_heads, 64, torch.float32, device)
        query = randn(gen, (len(seq_lens), heads, 64), torch.float32, device)
        split = [UNSPLIT, 2, 5][int(torch.randint(3, (1,), generator=gen))]
        out, ref, _ = _run(kv, query, split, window=window)
        assert_close_rel(out, ref, torch.float32)


def test_bad_inputs_raise_one_line_errors(gen, device):
    kv = PagedKV(gen, [5, 7], 8, 2, 64, torch.float16, device)
    q = randn(gen, (2, 4, 64), torch.float16, device)
    part = DecodePartition(1, 16)
    args = (kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, part)
    cases = [
        (lambda: paged_attention_decode(q[:, :3], *args), "num_heads=3"),
        (lambda: paged_attention_decode(q.float(), *args), "query.dtype"),
        (lambda: paged_attention_decode(q[:1], *args), "block_table.shape"),
        (
            lambda: paged_attention_decode(
                q, kv.key_cache, kv.value_cache, kv.block_table.float(), kv.seq_lens, part
            ),
            "block_table.dtype",
        ),
        (lambda: paged_attention_decode(q, *args, sliding_window=0), "sliding_window=0"),
        (lambda: paged_attention_decode(q, *args, out=q[:, :, :32]), "out.shape"),
    ]
    for call, needle in cases:
        with pytest.raises(KernelInputError) as info:
            call()
        assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_size,block_size",
    [(32, 8, 128, 16), (32, 32, 128, 32), (16, 2, 256, 128), (8, 1, 64, 8)],
)
def test_decode_large_gpu(gen, dtype, num_heads, num_kv_heads, head_size, block_size):
    seq_lens = torch.randint(1, 6000, (24,), generator=gen).tolist() + [8192, 1]
    kv = PagedKV(gen, seq_lens, block_size, num_kv_heads, head_size, dtype, "cuda", spare_blocks=64)
    query = randn(gen, (len(seq_lens), num_heads, head_size), dtype, "cuda")
    for split in (UNSPLIT, 7, 40):
        out, ref, _ = _run(kv, query, split, small_tile=False)
        assert_close_rel(out, ref, dtype)
    # The shape rule's own choice, with a window as well.
    cfg = decode_config(head_size, num_heads // num_kv_heads, True)
    for window in (None, 1000):
        part = decode_partition(len(seq_lens), num_kv_heads, 8192, cfg, 132, window)
        out = torch.full_like(query, float("nan"))
        paged_attention_decode(
            query,
            kv.key_cache,
            kv.value_cache,
            kv.block_table,
            kv.seq_lens,
            part,
            sliding_window=window,
            out=out,
        )
        ref = paged_attention_decode_reference(
            query, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, sliding_window=window
        )
        assert_close_rel(out, ref, dtype)
