"""CUDA graphs for the steps of `GPUModelRunner`: static buffers, padded sizes, capture, replay.

An eager step launches every layer's kernels from Python, which takes several times as long
as streaming a 7B model's weights (docs/architecture.md, "GPU runner host costs"), so small
steps are launch-bound. vLLM captures them in CUDA graphs; this module does the same, in two
families:

    decode graphs    decode-only steps (one new token per sequence). Capture sizes 1, 2, 4, 8,
                     16, 24, 32, 48, 64, ... 512 (up to max_num_seqs); a step of n decodes runs
                     the graph of the next size p >= n. One graph per (size, decode partition):
                     the split-K partition depends on the longest context, so that context is
                     rounded up to a power of two (`span_bucket`, at least 256, at most
                     max_model_len) and the partition is the one `decode_partition` picks for
                     that span; partitions past a sequence's end exit at once, so one graph
                     serves every context in its bucket. The forward and the LM head are in
                     the graph (fp32 logits [p, vocab]).
    mixed graphs     every other step (prefill, chunked prefill, prefill chunks with decodes)
                     of at most 512 tokens (and max_num_batched_tokens): tokens padded to the
                     next capture size t, sequences to s = min(t, largest decode size). The
                     variable-length attention kernel's grid depends only on (tokens,
                     sequences), and padded sequences own no query rows, so one graph serves
                     every mix of prefill and decode rows of its size (vLLM's full graphs for
                     mixed batches). The graph ends at the final norm of each sequence's last
                     row; the LM head runs eagerly on the real rows (padding them to s rows
                     would cost s full LM-head GEMM rows). Larger steps run eagerly: their
                     GEMMs, not the launches, set their time.

Static buffers (the largest size of either family): input ids, positions, slot mapping
`[tokens]`; seq lens `[seqs]`; block table `[seqs, W]` with W = table_width(max_model_len /
block_size); query start locations and logits indices of mixed steps. Under the hybrid KV
cache manager each KV cache group has its own slot mapping and block table; the other inputs,
and the decode partition (the full-attention one, which covers every window), are shared.
Padding rows: slot PAD_SLOT_ID (reshape_and_cache skips it), seq_len 0 (kernels write zeros or
nothing), block row all null block, id 0, position 0; padded sequences of a mixed step start at
the last real token, so they own no rows. The sampler always runs eagerly on the real rows (its
seeded generator stays outside the graph), so padded rows' outputs are never read. A step fills the
static buffers from persistent host state (`pagesim.gpu.input_buffers`): block-table rows kept per
request across steps, every input staged in one pinned buffer and copied in one transfer.

Capture is lazy (first use of a key, inside the step that needs it: a warm-up forward, which
also compiles any new Triton variant, then the capture) and `capture_all` captures every key a
run can meet before it starts, as vLLM does at start-up; served runs call it so that no capture
lands inside a timed step. Graphs share one memory pool: outputs are read right after their
own replay, before any other graph runs, which is the pool's condition.

`capture=False` runs the very same padded static-buffer forward eagerly (on any device): the
CPU tests compare it with the unpadded eager path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from pagesim.config import EngineConfig
from pagesim.cost.decode_launch import MIN_SPAN_BUCKET, span_bucket
from pagesim.gpu.attention import AttentionMetadata, device_num_sms
from pagesim.gpu.input_buffers import (
    BlockTableRows,
    GatheredTable,
    StagedBuffers,
    decode_slots,
    token_slots,
)
from pagesim.gpu.kernels.configs import DecodePartition, decode_partition
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace
from pagesim.gpu.model import StepMetadata
from pagesim.kvcache.block_table import PAD_SLOT_ID

#: Batch sizes captured (vLLM's list is 1, 2, 4 and multiples of 8 up to 512; coarser here so
#: that capture stays short: a decode step's GEMMs cost nearly the same for 129 and 160 rows).
CAPTURE_SIZES: tuple[int, ...] = (
    1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
)  # fmt: skip
#: Largest batch captured (vLLM's default max_cudagraph_capture_size).
MAX_CAPTURE_SIZE = 512


class GraphKey(NamedTuple):
    """What a captured graph is specialised on."""

    size: int  # padded batch: sequences = tokens (decode); tokens (mixed)
    num_partitions: int  # decode split count (1: unsplit; always 1 for mixed graphs)
    partition_size: int  # tokens per partition (0 when unsplit: unused by the kernel)
    skip_attention: bool  # calibration's attention-free timing
    mixed: bool = False  # a mixed-step graph (variable-length attention kernel)


#: Per KV cache group, the runner's rows and the scheduled requests' row indices in them.
GroupRows = Sequence[tuple[BlockTableRows, list[int]]]


@dataclass(slots=True)
class CapturedGraph:
    """A key's forward: its metadata over the static buffers, outputs, and the graph."""

    key: GraphKey
    metadata: StepMetadata | None  # None when attention is skipped
    graph: torch.cuda.CUDAGraph | None  # None in capture=False mode
    hidden: torch.Tensor | None = None  # [rows, hidden] of the last replay (graph output)
    logits: torch.Tensor | None = None  # [size, vocab] fp32 (decode graphs only)
    capture_s: float = 0.0


def capture_sizes(limit: int, max_size: int = MAX_CAPTURE_SIZE) -> tuple[int, ...]:
    """`CAPTURE_SIZES` up to min(limit, max_size), plus `limit` itself when it is below
    max_size and not in the list, so every step the scheduler can form is covered. `limit` is
    max_num_seqs for the decode graphs (sequences), max_num_batched_tokens for the mixed
    graphs (tokens)."""
    top = min(limit, max_size)
    sizes = [s for s in CAPTURE_SIZES if s <= top]
    if top not in sizes:
        sizes.append(top)
    return tuple(sizes)


def _pad_to(sizes: tuple[int, ...], n: int) -> int | None:
    """The smallest size >= n, or None if n exceeds them all."""
    for s in sizes:
        if s >= n:
            return s
    return None


class StepGraphs:
    """Static buffers and graphs of one runner's steps (one KV cache): decode and mixed.

    `model` is the runner's `RandomWeightDecoder`, `kv_caches` its caches (graphs bake their
    addresses in, so graphs belong to one cache), `config` the engine the runner serves (its
    block size and the step limits bound the graphs' shapes). `num_groups` is the KV cache
    groups whose tables a step carries (more than one under the hybrid layout). `log` receives
    one line per capture problem.
    """

    def __init__(
        self,
        model,
        kv_caches,
        config: EngineConfig,
        *,
        capture: bool = True,
        num_groups: int = 1,
        log: Callable[[str], None] | None = None,
    ) -> None:
        from pagesim.gpu.runner import table_width

        self.model = model
        self.kv_caches = kv_caches
        self.device = model.device
        self.block_size = block_size = config.block_size
        self.max_model_len = max_model_len = config.max_model_len
        self.num_groups = num_groups
        self.capture = capture and self.device.type == "cuda"
        self.sizes = capture_sizes(config.max_num_seqs)
        self.token_sizes = capture_sizes(config.max_num_batched_tokens)
        self.width = table_width(-(-max_model_len // block_size))
        self.log = log or (lambda msg: None)
        self.failed: str | None = None  # first capture error; graphs are off after it
        self.num_sms = device_num_sms(self.device)
        self._decode_cfg = model.attn.decode_config(self.device)
        self.max_seqs = self.sizes[-1]
        m = max(self.max_seqs, *self.token_sizes) if self.token_sizes else self.max_seqs
        dev = self.device
        # Per-step inputs staged in one pinned host buffer and copied in one transfer
        # (`StagedBuffers`); same dtypes as the eager path's tensors (Triton compiles one
        # variant per pointer dtype); rows of `pack` padded to 16 entries so every row starts
        # 16-byte aligned. pack rows: input ids, positions, then each group's slot mapping
        # (int64). The block tables come last, one per group: a step copies the tables of
        # the groups before the last whole, and of the last only the rows it uses.
        s = self.max_seqs
        self.staged = StagedBuffers(
            [
                ("pack", torch.int64, (2 + num_groups, -(-m // 16) * 16)),
                ("seq_lens", torch.int32, (s,)),
                ("mixed_query_start_loc", torch.int32, (s + 1,)),
                ("mixed_logits_indices", torch.int64, (s,)),
                ("block_tables", torch.int32, (num_groups, s, self.width)),
            ],
            dev,
        )
        staged = self.staged.device
        self.pack = staged["pack"]
        self.seq_lens = staged["seq_lens"]
        self.block_tables = staged["block_tables"]
        self.block_table = self.block_tables[0]
        # Mixed steps: their own query starts and last rows, loaded per step.
        self.mixed_query_start_loc = staged["mixed_query_start_loc"]
        self.mixed_logits_indices = staged["mixed_logits_indices"]
        self._table_row_bytes = self.block_table.stride(0) * self.block_table.element_size()
        self._table_offset = self.staged.offset("block_tables") + (
            (num_groups - 1) * s * self._table_row_bytes
        )  # where the last group's table starts
        # Decode steps: constant query starts and last rows.
        self.query_start_loc = torch.arange(s + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(s, dtype=torch.int64, device=dev)
        # The step's tables, gathered from the runner's rows into the staged host buffer.
        self.gathered = [GatheredTable(t) for t in self.staged.host["block_tables"]]
        self._reset_buffers()
        self.graphs: dict[GraphKey, CapturedGraph] = {}
        self._keys: dict[tuple[int, int], GraphKey] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.capture_s_total = 0.0

    # ---- choosing a graph ---------------------------------------------------------------------
    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a decode batch of `num_seqs` runs at, or None if too large."""
        return _pad_to(self.sizes, num_seqs)

    def mixed_seqs(self, size: int) -> int:
        """Sequences of a mixed graph of `size` tokens (each sequence has >= 1 token)."""
        return min(size, self.max_seqs)

    def key_for(self, scheduled, skip_attention: bool = False) -> GraphKey | None:
        """The graph a step runs, or None when it must run eagerly (larger than the largest
        size of its family, or graphs failed earlier)."""
        if self.failed is not None or not scheduled:
            return None
        if not all(sr.is_decode for sr in scheduled):
            tokens = sum(sr.num_new_tokens for sr in scheduled)
            size = _pad_to(self.token_sizes, tokens)
            if size is None or len(scheduled) > self.mixed_seqs(size):
                return None
            return GraphKey(size, 1, 0, skip_attention, True)
        size = self.padded_size(len(scheduled))
        if size is None:
            return None
        if skip_attention:
            return GraphKey(size, 1, 0, True)
        longest = max(sr.num_computed_tokens for sr in scheduled) + 1
        return self._key(size, span_bucket(longest, self.max_model_len))

    def _key(self, size: int, span: int) -> GraphKey:
        """The decode graph of `size` sequences over spans up to `span` (memoized: a step's
        host time is on its critical path, and sizes x span buckets are few)."""
        key = self._keys.get((size, span))
        if key is None:
            part = self._partition(size, span)
            split = part.num_partitions > 1  # unsplit: partition size 0, unused by the kernel
            key = GraphKey(size, part.num_partitions, part.partition_size if split else 0, False)
            self._keys[(size, span)] = key
        return key

    def _partition(self, size: int, span: int) -> DecodePartition:
        """Windowed only when every layer slides, so that the split covers every layer's
        context (a window's partitions start at its first token)."""
        m = self.model
        return decode_partition(
            size,
            m.num_kv_heads,
            span,
            self._decode_cfg,
            self.num_sms,
            m.spec.uniform_window,
            m.attn.min_partition_tokens,
        )

    def decode_partitions(
        self, num_seqs: int, longest: int
    ) -> tuple[DecodePartition, DecodePartition]:
        """(eager, graph): how a decode-only step of `num_seqs` sequences, the longest of
        `longest` tokens (new one included), splits its contexts when run eagerly (for that
        context, as `build_metadata` does) and replayed as a graph (for its padded size and
        span bucket). Where their `partition_cuts` differ, the two sum in another order."""
        key = self._key(self.padded_size(num_seqs), span_bucket(longest, self.max_model_len))
        return (
            self._partition(num_seqs, longest),
            DecodePartition(key.num_partitions, key.partition_size),
        )

    def all_keys(self, max_batch: int | None = None) -> list[GraphKey]:
        """Every key a served run can meet: decode sizes x span buckets, largest size first
        (with `max_batch`, only the sizes up to the one that batch pads to), then every mixed
        size, largest first."""
        top = self.padded_size(max_batch) if max_batch is not None else None
        sizes = [s for s in self.sizes if top is None or s <= top]
        spans, b = [], MIN_SPAN_BUCKET
        while b < self.max_model_len:
            spans.append(b)
            b *= 2
        spans.append(self.max_model_len)
        keys = {self._key(s, sp) for s in sizes for sp in spans}
        decode = sorted(keys, key=lambda k: (-k.size, k.num_partitions, k.partition_size))
        mixed = [GraphKey(t, 1, 0, False, True) for t in sorted(self.token_sizes, reverse=True)]
        return decode + mixed

    # ---- static buffers -------------------------------------------------------------------------
    def _reset_buffers(self) -> None:
        """All rows padding: nothing is written to the cache, nothing attended."""
        h = self.staged.host
        for buffer in h.values():
            buffer[...] = 0
        for gathered in self.gathered:
            gathered.reset()
        h["pack"][2:] = PAD_SLOT_ID
        self.staged.copy_to_device()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def load(self, scheduled, input_ids: list[int], key: GraphKey, tables: GroupRows) -> None:
        """Fill the static buffers for a step of `key`'s size (rows past the step: padding):
        the host side through numpy, then one transfer of the bytes the step uses.
        Per KV cache group, `(rows, idx)`: `rows.table[idx[i]]` is scheduled[i]'s block-table
        row (`BlockTableRows.update`)."""
        if key.mixed:
            self._load_mixed(scheduled, input_ids, key.size, tables)
            return
        size = key.size
        n = len(scheduled)
        h = self.staged.host
        pos = np.fromiter((sr.num_computed_tokens for sr in scheduled), np.int64, n)
        pack = h["pack"]
        pack[0, :n] = input_ids
        pack[1, :n] = pos
        for g, (rows, idx) in enumerate(tables):
            self.gathered[g].gather(rows, idx, size)
            pack[2 + g, :n] = decode_slots(h["block_tables"][g], pos, self.block_size)
        pack[:2, n:size] = 0
        pack[2:, n:size] = PAD_SLOT_ID
        seq_lens = h["seq_lens"]
        seq_lens[:n] = pos + 1
        seq_lens[n:size] = 0
        self.staged.copy_to_device(self._table_offset + size * self._table_row_bytes)

    def _load_mixed(self, scheduled, input_ids: list[int], size: int, tables: GroupRows) -> None:
        """A mixed step of T <= size tokens and n sequences: rows T.. and sequences n.. pad."""
        n = len(scheduled)
        seqs = self.mixed_seqs(size)
        h = self.staged.host
        starts = np.fromiter((sr.num_computed_tokens for sr in scheduled), np.int64, n)
        news = np.fromiter((sr.num_new_tokens for sr in scheduled), np.int64, n)
        t = len(input_ids)
        pack = h["pack"]
        for g, (rows, idx) in enumerate(tables):
            self.gathered[g].gather(rows, idx, seqs)
            positions, pack[2 + g, :t] = token_slots(
                h["block_tables"][g], starts, news, self.block_size
            )
        pack[0, :t] = input_ids
        pack[1, :t] = positions
        pack[:2, t:size] = 0
        pack[2:, t:size] = PAD_SLOT_ID
        qsl = h["mixed_query_start_loc"]
        qsl[0] = 0
        np.cumsum(news, out=qsl[1 : n + 1], dtype=np.int32)
        qsl[n + 1 : seqs + 1] = t
        seq_lens = h["seq_lens"]
        seq_lens[:n] = starts + news
        seq_lens[n:seqs] = 0
        last = h["mixed_logits_indices"]
        last[:n] = qsl[1 : n + 1]
        last[:n] -= 1
        last[n:seqs] = 0
        self.staged.copy_to_device(self._table_offset + seqs * self._table_row_bytes)

    def _metadata(self, key: GraphKey) -> StepMetadata | None:
        """The key's attention inputs over the static buffers, one per KV cache group."""
        if key.skip_attention:
            return None
        part, ws = None, None
        if not key.mixed and key.num_partitions == 1:
            part = DecodePartition(1, self._decode_cfg.tile_n)
        elif not key.mixed:  # one workspace: the groups' layers run one after another
            part = DecodePartition(key.num_partitions, key.partition_size)
            m = self.model
            ws = DecodeWorkspace.allocate(
                key.size, m.num_heads, m.head_size, key.num_partitions, self.device
            )
        groups = tuple(self._group_metadata(key, g, part, ws) for g in range(self.num_groups))
        return groups if self.num_groups > 1 else groups[0]

    def _group_metadata(
        self, key: GraphKey, group: int, part: DecodePartition | None, ws: DecodeWorkspace | None
    ) -> AttentionMetadata:
        p = key.size
        slots, tables = self.pack[2 + group, :p], self.block_tables[group]
        if key.mixed:
            s = self.mixed_seqs(p)
            return AttentionMetadata(
                num_seqs=s,
                num_actual_tokens=p,
                max_query_len=p,
                max_seq_len=self.max_model_len,
                slot_mapping=slots,
                block_table=tables[:s],
                seq_lens=self.seq_lens[:s],
                query_start_loc=self.mixed_query_start_loc[: s + 1],
            )
        assert part is not None  # a decode key
        return AttentionMetadata(
            num_seqs=p,
            num_actual_tokens=p,
            max_query_len=1,
            max_seq_len=part.num_partitions * part.partition_size,
            slot_mapping=slots,
            block_table=tables[:p],
            seq_lens=self.seq_lens[:p],
            query_start_loc=self.query_start_loc[: p + 1],
            decode_partition=part,
            decode_workspace=ws,
        )

    def _forward(self, entry: CapturedGraph) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The padded forward over the static buffers: final hidden rows and, for decode
        graphs, fp32 logits (mixed graphs: None, the LM head runs on the real rows)."""
        p, skip = entry.key.size, entry.key.skip_attention
        if entry.key.mixed:
            last = self.mixed_logits_indices[: self.mixed_seqs(p)]
        else:
            last = self.logits_indices[:p]
        hidden = self.model.forward(
            self.pack[0, :p],
            self.pack[1, :p],
            entry.metadata,
            None if skip else self.kv_caches,
            last,
            skip_attention=skip,
        )
        return hidden, None if entry.key.mixed else self.model.compute_logits(hidden)

    # ---- capture and replay ---------------------------------------------------------------------
    def run(self, key: GraphKey) -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """Hidden rows and logits (None for a mixed graph) of the loaded step, and whether a
        graph was captured for it now. Raises on a capture failure (the caller then runs the
        step eagerly; `failed` stays set so no other capture is tried)."""
        entry = self.graphs.get(key)
        captured = False
        if entry is None:
            entry = self._capture(key)
            captured = True
        if entry.graph is None:
            entry.hidden, entry.logits = self._forward(entry)
        else:
            entry.graph.replay()
        return entry.hidden, entry.logits, captured

    def _capture(self, key: GraphKey) -> CapturedGraph:
        t0 = time.perf_counter()
        entry = CapturedGraph(key, self._metadata(key), None)
        if self.capture:
            try:
                self._forward(entry)  # warm-up: Triton compiles, cuBLAS picks its kernels
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                # thread_local: the SM-clock sampler thread's NVML reads cannot void a capture
                with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                    entry.hidden, entry.logits = self._forward(entry)
                torch.cuda.synchronize(self.device)
                entry.graph = graph
            except Exception as e:  # any capture error turns graphs off
                self.failed = f"{type(e).__name__}: {e}".splitlines()[0]
                self.log(
                    f"CUDA graph capture of {tuple(key)} failed, running eagerly from "
                    f"now on: {self.failed}"
                )
                raise
        entry.capture_s = time.perf_counter() - t0
        self.capture_s_total += entry.capture_s
        self.graphs[key] = entry
        return entry

    def capture_all(self, max_batch: int | None = None) -> tuple[int, float]:
        """Capture every key of `all_keys(max_batch)` not captured yet (padding buffers, so
        the warm-ups write nothing). Returns (graphs captured now, seconds). Stops at the
        first failure. A run of R requests never batches more than R: pass it as max_batch."""
        t0 = time.perf_counter()
        self._reset_buffers()
        n = 0
        for key in self.all_keys(max_batch):
            if key in self.graphs:
                continue
            try:
                self._capture(key)
            except Exception:  # logged in _capture; eager from here on
                break
            n += 1
        return n, time.perf_counter() - t0
