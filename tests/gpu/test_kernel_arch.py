"""Launch parameters per compute capability: the H200's stay as measured, an sm_80 or sm_89
card gets tiles within its shared memory, and those tiles give the reference's answer (on the
GPU when there is one; in the CPU interpreter the tile shapes and loop bounds are exercised,
warps, stages and shared memory are not)."""

from __future__ import annotations

import pytest
import torch
from kernel_references import paged_attention_decode_reference, paged_attention_prefill_reference
from paged_kv_helpers import PagedKV, assert_close_rel, randn

from pagesim.errors import ConfigError
from pagesim.gpu.kernels.arch import ARCHS, SM80, SM86, SM89, SM90, arch_of, shared_bytes
from pagesim.gpu.kernels.configs import DecodePartition, KernelConfig, decode_config, prefill_config
from pagesim.gpu.kernels.paged_attention import paged_attention_decode
from pagesim.gpu.kernels.prefill_attention import paged_attention_prefill
from pagesim.kvcache.block_table import build_query_start_loc


def test_capabilities_map_to_their_sm() -> None:
    assert arch_of("8.0") is SM80 and arch_of("8.6") is SM86 and arch_of("8.9") is SM89
    assert arch_of("9.0") is SM90
    assert arch_of("8.7") is SM86  # unknown: the newest known at or below it
    assert arch_of("10.0") is SM90 and arch_of("12.0") is SM90
    for bad in ("7.5", "6.1", "nine", "9"):
        with pytest.raises(ConfigError, match="8.0 or newer"):
            arch_of(bad)


def test_the_h200_keeps_its_measured_configs() -> None:
    assert prefill_config(128, 4, True) == KernelConfig(128, 64, 8, 3)
    assert prefill_config(256, 1, True) == KernelConfig(64, 32, 4, 2)
    assert decode_config(128, 4, True) == KernelConfig(16, 64, 4, 3, 4)
    assert decode_config(64, 1, True).programs_per_sm == 7
    assert decode_config(256, 1, True).programs_per_sm == 2
    assert prefill_config(128, 4, True, arch=SM90) == prefill_config(128, 4, True)


@pytest.mark.parametrize("arch", list(ARCHS.values()), ids=lambda a: a.name)
@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_every_prefill_tile_fits_its_sm(arch, head_size, group) -> None:
    cfg = prefill_config(head_size, group, True, arch=arch)
    assert shared_bytes(cfg.block_m, cfg.tile_n, head_size, cfg.num_stages) <= (
        arch.shared_per_block_bytes
    )
    assert cfg.block_m % group == 0


def test_smaller_sms_get_smaller_tiles_and_fewer_programs() -> None:
    assert prefill_config(128, 4, True, arch=SM80) == KernelConfig(128, 64, 8, 3)
    assert prefill_config(128, 4, True, arch=SM89) == KernelConfig(128, 64, 8, 2)
    assert decode_config(128, 4, True, arch=SM80).programs_per_sm == 4
    assert decode_config(128, 4, True, arch=SM89).programs_per_sm == 2
    assert decode_config(256, 1, True, arch=SM89).programs_per_sm == 1


@pytest.mark.parametrize("arch", [SM80, SM89], ids=lambda a: a.name)
def test_prefill_tiles_of_other_sms_match_the_reference(gen, device, arch) -> None:
    """128-row query tiles over 64-token K/V tiles (fp16, head size 64)."""
    cfg = prefill_config(64, 2, True, arch=arch)
    seqs = [(0, 70), (40, 30), (130, 1)]  # (cached, new): spans several K/V tiles
    seq_lens = [c + n for c, n in seqs]
    kv = PagedKV(gen, seq_lens, 16, 2, 64, torch.float16, device)
    qsl = torch.tensor(
        build_query_start_loc([n for _, n in seqs]), dtype=torch.int32, device=device
    )
    query = randn(gen, (int(qsl[-1]), 4, 64), torch.float16, device)
    args = (query, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, qsl)
    out = paged_attention_prefill(*args, config=cfg)
    assert_close_rel(out, paged_attention_prefill_reference(*args), torch.float16)


@pytest.mark.parametrize("arch", [SM80, SM89], ids=lambda a: a.name)
def test_decode_tiles_of_other_sms_match_the_reference(gen, device, arch) -> None:
    cfg = decode_config(64, 4, True, arch=arch)
    seq_lens = [150, 37, 64]
    kv = PagedKV(gen, seq_lens, 16, 1, 64, torch.float16, device)
    query = randn(gen, (3, 4, 64), torch.float16, device)
    args = (query, kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens)
    out = paged_attention_decode(*args, DecodePartition(1, 150), config=cfg)
    assert_close_rel(out, paged_attention_decode_reference(*args), torch.float16)
