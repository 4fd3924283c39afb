"""reshape_and_cache against its torch reference: exact copies, padding slots skipped."""

from __future__ import annotations

import pytest
import torch
from kernel_references import reshape_and_cache_reference
from paged_kv_helpers import randn

from pagesim.errors import KernelInputError
from pagesim.gpu.kernels.reshape_and_cache import reshape_and_cache
from pagesim.kvcache.block_table import PAD_SLOT_ID, build_slot_mapping


def _caches(gen, num_blocks, block_size, heads, head_size, dtype, device):
    shape = (num_blocks, block_size, heads, head_size)
    return randn(gen, shape, dtype, device), randn(gen, shape, dtype, device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "block_size,num_kv_heads,head_size", [(8, 1, 64), (16, 3, 64), (32, 2, 128), (128, 1, 256)]
)
def test_matches_reference_and_skips_padding(
    gen, device, dtype, block_size, num_kv_heads, head_size
):
    num_blocks = 6
    # Three sequences with ragged positions, slots from the core's own slot mapping,
    # padded with PAD_SLOT_ID rows as a CUDA-graph batch would be.
    ids = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    rows = [ids[:2], ids[2:3], ids[3:5]]
    starts = [block_size - 2, 0, block_size + 1]
    new = [3, 1, 2]
    slots = build_slot_mapping(rows, starts, new, block_size, pad_to=9)
    assert slots.count(PAD_SLOT_ID) == 3
    slot_mapping = torch.tensor(slots, device=device)
    key = randn(gen, (9, num_kv_heads, head_size), dtype, device)
    value = randn(gen, (9, num_kv_heads, head_size), dtype, device)
    kc, vc = _caches(gen, num_blocks, block_size, num_kv_heads, head_size, dtype, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()

    reshape_and_cache(key, value, kc, vc, slot_mapping)
    reshape_and_cache_reference(key, value, kc_ref, vc_ref, slot_mapping)

    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    # The written rows hold the inputs, and everything else kept its old value.
    blk, off = rows[0][1], 0  # token at position block_size of sequence 0: row 2 of the batch
    assert torch.equal(kc[blk, off], key[2])


def test_int32_slots_and_strided_inputs(gen, device):
    # K and V as views into a fused [tokens, 2, heads, D] projection: non-contiguous rows.
    kv = randn(gen, (5, 2, 2, 64), torch.float16, device)
    key, value = kv[:, 0], kv[:, 1]
    kc, vc = _caches(gen, 4, 8, 2, 64, torch.float16, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    slots = torch.tensor([9, -1, 31, 8, 16], dtype=torch.int32, device=device)
    reshape_and_cache(key, value, kc, vc, slots)
    reshape_and_cache_reference(key, value, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)


def test_bad_inputs_raise_one_line_errors(device):
    kc = torch.zeros(4, 8, 2, 64, dtype=torch.float16, device=device)
    key = torch.zeros(3, 2, 64, dtype=torch.float16, device=device)
    slots = torch.zeros(3, dtype=torch.int64, device=device)
    cases = [
        (key[:, :1], key, kc, kc, slots, "key.shape"),
        (key, key, kc, kc, slots[:2], "slot_mapping.shape"),
        (key.float(), key, kc, kc, slots, "key.dtype"),
        (key, key, kc, kc, slots.float(), "slot_mapping.dtype"),
        (key, key, kc, kc[:, :, :, :32], slots, "value_cache.shape"),
        (key, key, kc[:, :5], kc[:, :5], slots, "block_size=5"),
        (key.transpose(1, 2).contiguous().transpose(1, 2), key, kc, kc, slots, "key.stride"),
    ]
    for k, v, c1, c2, s, needle in cases:
        with pytest.raises(KernelInputError) as info:
            reshape_and_cache(k, v, c1, c2, s)
        msg = str(info.value)
        assert needle in msg and "\n" not in msg


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_batch_gpu(gen, dtype):
    num_tokens, heads, head_size, block_size, num_blocks = 8192, 8, 128, 16, 2048
    perm = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    perm[::7] = PAD_SLOT_ID
    slots = perm.cuda()
    key = randn(gen, (num_tokens, heads, head_size), dtype, "cuda")
    value = randn(gen, (num_tokens, heads, head_size), dtype, "cuda")
    kc = torch.full(
        (num_blocks, block_size, heads, head_size), float("nan"), dtype=dtype, device="cuda"
    )
    vc = kc.clone()
    kc_ref, vc_ref = kc.clone(), vc.clone()
    reshape_and_cache(key, value, kc, vc, slots)
    reshape_and_cache_reference(key, value, kc_ref, vc_ref, slots)
    assert torch.equal(kc.nan_to_num(7.0), kc_ref.nan_to_num(7.0))
    assert torch.equal(vc.nan_to_num(7.0), vc_ref.nan_to_num(7.0))
    written = (kc.flatten(0, 1)[slots[slots >= 0]]).isnan().sum()
    assert int(written) == 0
