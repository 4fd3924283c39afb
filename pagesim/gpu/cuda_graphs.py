"""CUDA graphs for decode-only steps: static buffers, padded batch sizes, capture and replay.

An eager decode step launches every layer's kernels from Python (~17 ms for a 7B model on an
H200 whatever the batch below ~64, while the weights stream in ~3-4 ms), so small decode steps
are launch-bound. vLLM captures the decode forward in CUDA graphs; this module does the same
for `GPUModelRunner`:

    capture sizes    1, 2, 4, 8, 16, 24, 32, 48, 64, ... 512 (up to max_num_seqs); a step of
                     n decodes runs the graph of the next size p >= n
    static buffers   input ids, positions, slot mapping, seq lens [max size]; block table
                     [max size, W] with W = table_width(max_model_len / block_size); rows n..p-1
                     are padding: slot PAD_SLOT_ID (reshape_and_cache skips it), seq_len 0 (the
                     decode kernel writes zeros), block row all null block, id 0, position 0
    one graph per    (size, decode partition, skip_attention): the split-K partition depends on
                     the longest context, so the step's longest context is rounded up to a
                     power of two (`span_bucket`, at least 256, at most max_model_len) and the
                     partition is the one `decode_partition` picks for that span; partitions
                     past a sequence's end exit at once, so one graph serves every context in
                     its bucket. Unsplit partitions are one key whatever the span.
    in the graph     embedding .. final norm, and the LM head (fp32 logits [p, vocab]); the
                     sampler runs eagerly on the first n rows (its seeded generator stays
                     outside the graph), so padded rows' outputs are never read

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from pagesim.gpu.attention import DEFAULT_NUM_SMS, AttentionMetadata
from pagesim.gpu.kernels.configs import DecodePartition, decode_config, decode_partition
from pagesim.gpu.kernels.paged_attention import DecodeWorkspace
from pagesim.kvcache.block_table import PAD_SLOT_ID

#: Batch sizes captured (vLLM's list is 1, 2, 4 and multiples of 8 up to 512; coarser here so
#: that capture stays short: a decode step's GEMMs cost nearly the same for 129 and 160 rows).
CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192,
                                  224, 256, 320, 384, 448, 512)
#: Largest batch captured (vLLM's default max_cudagraph_capture_size).
MAX_CAPTURE_SIZE = 512
#: Shortest span bucket, tokens (below it every batch size runs the decode kernel unsplit).
MIN_SPAN_BUCKET = 256


class GraphKey(NamedTuple):
    """What a captured graph is specialised on."""

    size: int  # padded batch (sequences = tokens)
    num_partitions: int  # decode split count (1: unsplit)
    partition_size: int  # tokens per partition (0 when unsplit: unused by the kernel)
    skip_attention: bool  # calibration's attention-free timing


@dataclass(slots=True)
class CapturedGraph:
    """A key's forward: its metadata over the static buffers, outputs, and the graph."""

    key: GraphKey
    metadata: AttentionMetadata | None  # None when attention is skipped
    graph: torch.cuda.CUDAGraph | None  # None in capture=False mode
    hidden: torch.Tensor | None = None  # [size, hidden] of the last replay (graph output)
    logits: torch.Tensor | None = None  # [size, vocab] fp32
    capture_s: float = 0.0


def capture_sizes(max_num_seqs: int, max_size: int = MAX_CAPTURE_SIZE) -> tuple[int, ...]:
    """`CAPTURE_SIZES` up to min(max_num_seqs, max_size), plus max_num_seqs itself when it is
    below max_size and not in the list (so every batch the scheduler can form is covered)."""
    top = min(max_num_seqs, max_size)
    sizes = [s for s in CAPTURE_SIZES if s <= top]
    if top not in sizes:
        sizes.append(top)
    return tuple(sizes)


def span_bucket(max_seq_len: int, max_model_len: int) -> int:
    """The step's longest context rounded up to a power of two, within
    [MIN_SPAN_BUCKET, max_model_len] (never below `max_seq_len`)."""
    b = MIN_SPAN_BUCKET
    while b < max_seq_len:
        b *= 2
    return max(max_seq_len, min(b, max_model_len))


def is_decode_only(scheduled) -> bool:
    """Every scheduled request computes exactly one new token (the decode kernel's steps)."""
    return bool(scheduled) and all(sr.num_new_tokens == 1 for sr in scheduled)


class DecodeGraphs:
    """Static buffers and graphs of one runner's decode-only steps (one KV cache).

    `model` is the runner's `RandomWeightDecoder`, `kv_caches` its caches (graphs bake their
    addresses in, so graphs belong to one cache). `log` receives one line per capture problem.
    """

    def __init__(self, model, kv_caches, *, block_size: int, max_num_seqs: int,
                 max_model_len: int, capture: bool = True, max_size: int = MAX_CAPTURE_SIZE,
                 log: Callable[[str], None] | None = None) -> None:
        from pagesim.gpu.runner import table_width

        self.model = model
        self.kv_caches = kv_caches
        self.device = model.device
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.capture = capture and self.device.type == "cuda"
        self.sizes = capture_sizes(max_num_seqs, max_size)
        self.width = table_width(-(-max_model_len // block_size))
        self.log = log or (lambda msg: None)
        self.failed: str | None = None  # first capture error; graphs are off after it
        self.num_sms = (torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else DEFAULT_NUM_SMS)
        self._decode_cfg = decode_config(model.head_size, model.num_heads // model.num_kv_heads,
                                         self.device.type == "cuda")
        m, dev = self.sizes[-1], self.device
        # Same dtypes as the eager path's tensors (Triton compiles one variant per pointer
        # dtype); rows of `pack` padded to 16 entries so every row starts 16-byte aligned.
        # pack rows: input ids, positions, slot mapping (int64)
        self.pack = torch.zeros((3, -(-m // 16) * 16), dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(m, dtype=torch.int32, device=dev)
        self.block_table = torch.zeros((m, self.width), dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(m + 1, dtype=torch.int32, device=dev)
        self.logits_indices = torch.arange(m, dtype=torch.int64, device=dev)
        self._reset_buffers()
        self.graphs: dict[GraphKey, CapturedGraph] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.capture_s_total = 0.0

    # ---- choosing a graph ---------------------------------------------------------------------
    def padded_size(self, num_seqs: int) -> int | None:
        """The captured size a batch of `num_seqs` runs at, or None if it is too large."""
        for s in self.sizes:
            if s >= num_seqs:
                return s
        return None

    def key_for(self, scheduled, skip_attention: bool = False) -> GraphKey | None:
        """The graph a step runs, or None when it must run eagerly (not decode-only, larger
        than the largest size, or graphs failed earlier)."""
        if self.failed is not None or not is_decode_only(scheduled):
            return None
        size = self.padded_size(len(scheduled))
        if size is None:
            return None
        if skip_attention:
            return GraphKey(size, 1, 0, True)
        longest = max(sr.num_computed_tokens for sr in scheduled) + 1
        return self._key(size, span_bucket(longest, self.max_model_len))

    def _key(self, size: int, span: int) -> GraphKey:
        part = self._partition(size, span)
        if part.num_partitions == 1:
            return GraphKey(size, 1, 0, False)
        return GraphKey(size, part.num_partitions, part.partition_size, False)

    def _partition(self, size: int, span: int) -> DecodePartition:
        m = self.model
        return decode_partition(size, m.num_kv_heads, span, self._decode_cfg, self.num_sms,
                                m.spec.sliding_window, m.attn.min_partition_tokens)

    def all_keys(self, max_batch: int | None = None) -> list[GraphKey]:
        """Every key a served run can meet (sizes x span buckets), largest size first; with
        `max_batch`, only the sizes up to the one that batch pads to."""
        top = self.padded_size(max_batch) if max_batch is not None else None
        sizes = [s for s in self.sizes if top is None or s <= top]
        spans, b = [], MIN_SPAN_BUCKET
        while b < self.max_model_len:
            spans.append(b)
            b *= 2
        spans.append(self.max_model_len)
        keys = {self._key(s, sp) for s in sizes for sp in spans}
        return sorted(keys, key=lambda k: (-k.size, k.num_partitions, k.partition_size))

    # ---- static buffers -------------------------------------------------------------------------
    def _reset_buffers(self) -> None:
        """All rows padding: nothing is written to the cache, nothing attended."""
        self.pack.zero_()
        self.pack[2].fill_(PAD_SLOT_ID)
        self.seq_lens.zero_()
        self.block_table.zero_()

    def load(self, scheduled, input_ids: list[int], size: int) -> None:
        """Fill rows 0..size-1 of the static buffers for a decode-only step (rows past the
        batch: padding). Host arrays are built with numpy, then copied in three transfers."""
        n = len(scheduled)
        bs = self.block_size
        pos = np.fromiter((sr.num_computed_tokens for sr in scheduled), np.int64, n)
        table = np.zeros((size, self.width), dtype=np.int32)
        for i, sr in enumerate(scheduled):
            row = sr.block_ids
            table[i, :len(row)] = row
        pack = np.zeros((3, size), dtype=np.int64)
        pack[0, :n] = input_ids
        pack[1, :n] = pos
        pack[2] = PAD_SLOT_ID
        pack[2, :n] = table[np.arange(n), pos // bs].astype(np.int64) * bs + pos % bs
        seq_lens = np.zeros(size, dtype=np.int32)
        seq_lens[:n] = pos + 1
        self.pack[:, :size].copy_(torch.from_numpy(pack), non_blocking=True)
        self.seq_lens[:size].copy_(torch.from_numpy(seq_lens), non_blocking=True)
        self.block_table[:size].copy_(torch.from_numpy(table), non_blocking=True)

    def _metadata(self, key: GraphKey) -> AttentionMetadata | None:
        if key.skip_attention:
            return None
        p = key.size
        if key.num_partitions == 1:
            part = DecodePartition(1, self._decode_cfg.tile_n)
            ws = None
        else:
            part = DecodePartition(key.num_partitions, key.partition_size)
            ws = DecodeWorkspace.allocate(p, self.model.num_heads, self.model.head_size,
                                          key.num_partitions, self.device)
        return AttentionMetadata(
            num_seqs=p, num_actual_tokens=p, max_query_len=1,
            max_seq_len=part.num_partitions * part.partition_size,
            slot_mapping=self.pack[2, :p], block_table=self.block_table[:p],
            seq_lens=self.seq_lens[:p], query_start_loc=self.query_start_loc[:p + 1],
            decode_partition=part, decode_workspace=ws)

    def _forward(self, entry: CapturedGraph) -> tuple[torch.Tensor, torch.Tensor]:
        """The padded forward over the static buffers: final hidden rows and fp32 logits."""
        p, skip = entry.key.size, entry.key.skip_attention
        hidden = self.model.forward(self.pack[0, :p], self.pack[1, :p], entry.metadata,
                                    None if skip else self.kv_caches, self.logits_indices[:p],
                                    skip_attention=skip)
        return hidden, self.model.compute_logits(hidden)

    # ---- capture and replay ---------------------------------------------------------------------
    def run(self, key: GraphKey) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Hidden rows `[size, hidden]` and logits `[size, vocab]` of the loaded step, and
        whether a graph was captured for it now. Raises on a capture failure (the caller then
        runs the step eagerly; `failed` stays set so no other capture is tried)."""
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
                self.log(f"CUDA graph capture of {tuple(key)} failed, running eagerly from "
                         f"now on: {self.failed}")
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
