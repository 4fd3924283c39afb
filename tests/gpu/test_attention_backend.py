"""The backend over several engine steps, checked against attention over the true K/V history.

The reference here never looks at block tables: it keeps every sequence's K/V in order and
runs plain causal attention, so the cache writes, the slot mapping and the block-table reads
are checked together.
"""

from __future__ import annotations

import math

import pytest
import torch
from paged_kv_helpers import assert_close_rel, randn

from pagesim.errors import KernelInputError
from pagesim.gpu.attention import AttentionMetadata, PagedAttentionBackend
from pagesim.gpu.kernels.configs import decode_config, decode_partition


class Engine:
    """Blocks handed out from a permuted pool, caches, and each sequence's K/V history."""

    def __init__(self, gen, backend: PagedAttentionBackend, num_blocks: int, dtype, device):
        self.gen, self.backend, self.dtype, self.device = gen, backend, dtype, device
        self.free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
        shape = backend.kv_cache_shape(num_blocks)
        self.key_cache = randn(gen, shape, dtype, device)
        self.value_cache = randn(gen, shape, dtype, device)
        self.blocks: dict[int, list[int]] = {}
        self.hist_k: dict[int, list[torch.Tensor]] = {}
        self.hist_v: dict[int, list[torch.Tensor]] = {}

    def step(self, new_tokens: dict[int, int], pad_to=None, num_sms=None):
        """Run one layer for one step; returns (metadata, output rows, reference rows)."""
        b, bs = self.backend, self.backend.block_size
        seqs = list(new_tokens)
        computed = [sum(t.shape[0] for t in self.hist_k.get(s, [])) for s in seqs]
        for s, c in zip(seqs, computed, strict=True):
            row = self.blocks.setdefault(s, [])
            while len(row) * bs < c + new_tokens[s]:
                row.append(self.free.pop())
        md = b.build_metadata(
            [self.blocks[s] for s in seqs],
            computed,
            [new_tokens[s] for s in seqs],
            self.device,
            pad_to=pad_to,
            num_sms=num_sms,
        )
        n_tok = md.slot_mapping.shape[0]
        q = randn(self.gen, (n_tok, b.num_heads, b.head_size), self.dtype, self.device)
        k = randn(self.gen, (n_tok, b.num_kv_heads, b.head_size), self.dtype, self.device)
        v = randn(self.gen, (n_tok, b.num_kv_heads, b.head_size), self.dtype, self.device)
        out = torch.full_like(q, float("nan"))
        b.forward(q, k, v, self.key_cache, self.value_cache, md, out=out)
        ref = torch.zeros(q.shape, dtype=torch.float32, device=self.device)
        row = 0
        for s, c in zip(seqs, computed, strict=True):
            n = new_tokens[s]
            self.hist_k.setdefault(s, []).append(k[row : row + n])
            self.hist_v.setdefault(s, []).append(v[row : row + n])
            ref[row : row + n] = self._attend(q[row : row + n], s, c)
            row += n
        return md, out, ref

    def _attend(self, q, s, computed):
        b = self.backend
        keys = torch.cat(self.hist_k[s]).float().repeat_interleave(b.num_queries_per_kv, 1)
        vals = torch.cat(self.hist_v[s]).float().repeat_interleave(b.num_queries_per_kv, 1)
        q_pos = torch.arange(computed, computed + q.shape[0], device=q.device)[:, None]
        k_pos = torch.arange(keys.shape[0], device=q.device)[None, :]
        visible = k_pos <= q_pos
        if b.sliding_window:
            visible &= q_pos - k_pos < b.sliding_window
        logits = torch.einsum("qhd,khd->hqk", q.float(), keys) * b.scale
        probs = logits.masked_fill(~visible, float("-inf")).softmax(-1)
        return torch.einsum("hqk,khd->qhd", probs, vals)

    def check_cache(self):
        """Every token of every history sits at its block-table slot."""
        bs = self.backend.block_size
        for s, row in self.blocks.items():
            keys = torch.cat(self.hist_k[s])
            got = self.key_cache[torch.tensor(row, device=self.device)].flatten(0, 1)
            assert torch.equal(got[: keys.shape[0]], keys), f"sequence {s} K misplaced"
            assert len(row) == math.ceil(keys.shape[0] / bs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 6])
def test_steps_chunked_prefill_mixed_and_decode(gen, device, dtype, window):
    backend = PagedAttentionBackend(
        num_heads=4,
        num_kv_heads=2,
        head_size=64,
        block_size=8,
        sliding_window=window,
        min_partition_tokens=8,
    )
    eng = Engine(gen, backend, num_blocks=40, dtype=dtype, device=device)
    # 1: prefill chunks.  2: rest of a prompt + a decode + a new prompt (mixed).
    # 3: decode-only, unsplit (one SM).  4: a long chunk on a cached prefix plus a decode.
    # 5: decode-only over a 143-token context with 64 SMs: the rule splits it (16-token tiles
    #    on the CPU; on a GPU the 64-token tile keeps it whole, as measured best there).
    steps = [
        ({0: 12, 1: 7}, None),
        ({0: 8, 1: 1, 2: 13}, None),
        ({0: 1, 1: 1, 2: 1}, 1),
        ({0: 121, 2: 1}, None),
        ({2: 1, 0: 1, 1: 1}, 64),
    ]
    for new_tokens, num_sms in steps:
        md, out, ref = eng.step(new_tokens, pad_to=sum(new_tokens.values()) + 2, num_sms=num_sms)
        n = md.num_actual_tokens
        assert md.is_decode_only == all(v == 1 for v in new_tokens.values())
        assert_close_rel(out[:n], ref[:n], dtype)
        assert out[n:].isnan().all()  # padding rows untouched
        if md.is_decode_only:  # the backend applies the shape rule with its own config
            cfg = decode_config(64, 2, device == "cuda")
            assert md.decode_partition == decode_partition(
                3, 2, md.max_seq_len, cfg, num_sms, window, backend.min_partition_tokens
            )
            assert (md.decode_workspace is None) == (md.decode_partition.num_partitions == 1)
        if num_sms == 64 and window is None and device == "cpu":  # 16-token tiles: split
            assert md.decode_partition.num_partitions > 1
        if num_sms == 1:
            assert md.decode_partition.num_partitions == 1
    eng.check_cache()


def test_metadata_of_a_mixed_step(device):
    backend = PagedAttentionBackend(8, 2, 128, 16)
    md = backend.build_metadata([[3, 5], [7, 2]], [16, 20], [14, 1], device)
    assert isinstance(md, AttentionMetadata) and not md.is_decode_only
    assert md.seq_lens.tolist() == [30, 21]
    assert md.query_start_loc.tolist() == [0, 14, 15]
    assert md.slot_mapping.tolist() == [5 * 16 + i for i in range(14)] + [2 * 16 + 4]
    assert md.block_table.tolist() == [[3, 5], [7, 2]]
    assert (md.max_query_len, md.max_seq_len, md.num_actual_tokens) == (14, 30, 15)


def test_bad_backend_settings():
    for kwargs, needle in [
        (dict(num_heads=6, num_kv_heads=4), "num_heads=6"),
        (dict(head_size=96), "head_size=96"),
        (dict(block_size=24), "block_size=24"),
        (dict(sliding_window=0), "sliding_window=0"),
    ]:
        args = dict(num_heads=8, num_kv_heads=2, head_size=64, block_size=16) | kwargs
        with pytest.raises(KernelInputError, match=needle):
            PagedAttentionBackend(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_steps_large_gpu(gen, dtype):
    backend = PagedAttentionBackend(num_heads=32, num_kv_heads=8, head_size=128, block_size=16)
    eng = Engine(gen, backend, num_blocks=3000, dtype=dtype, device="cuda")
    prompts = {i: int(n) for i, n in enumerate(torch.randint(1, 3000, (12,), generator=gen))}
    md, out, ref = eng.step({i: min(n, 1024) for i, n in prompts.items()})
    assert_close_rel(out[: md.num_actual_tokens], ref[: md.num_actual_tokens], dtype)
    rest = {i: n - 1024 for i, n in prompts.items() if n > 1024}
    md, out, ref = eng.step(rest | {i: 1 for i in prompts if i not in rest})
    assert_close_rel(out[: md.num_actual_tokens], ref[: md.num_actual_tokens], dtype)
    for _ in range(3):
        md, out, ref = eng.step({i: 1 for i in prompts})
        assert md.is_decode_only and md.decode_partition.num_partitions > 1  # 96 programs
        assert_close_rel(out, ref, dtype)
    eng.check_cache()
