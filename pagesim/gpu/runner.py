"""`GPUModelRunner`: executes a scheduled step on the GPU with the random-weight model.

It implements the `ModelRunner` protocol (`pagesim.scheduler.output`), the same seam as the
simulator's `CostModelRunner`, so the scheduler cannot tell them apart. One step:

    1. prepare (host): input ids, positions, block tables, slot mapping, query starts, copied
       to the device. Eager steps build them with the core's own functions
       (`pagesim.kvcache.block_table`, via the attention backend); graph steps keep block-table
       rows across steps and stage every input in one pinned buffer copied in one transfer
       (`pagesim.gpu.input_buffers`, checked against the core's functions by the CPU tests);
    2. device, in stream order: swap-out copies (GPU -> pinned CPU cache), swap-in copies,
       copy-on-write block copies, the forward pass, the LM head and the sampler;
    3. the sampled ids come back to the host (the sync vLLM also makes every step); the
       runner returns `synthetic_token(...)` for every request that completed its tokens,
       exactly as the simulator's runner does, so both worlds produce the same tokens.

Timing: CUDA events between the device phases (`time_breakdown_s`: "swap", "copy",
"forward", "sample" in device seconds, "prepare" in host seconds) and `step_time_s` the
wall time of the whole call. Every step is also appended to `step_records` with its batch
shape, for calibration checks and the per-step records of a real run.

Steps of at most 512 tokens replay CUDA graphs (`pagesim.gpu.cuda_graphs`, vLLM's approach:
sizes padded to a captured size, static input buffers): decode-only steps with the LM head in
the graph, every other step (prefill, chunked prefill, mixed) up to the final norm, its LM
head eager. Larger steps run eagerly, launching their kernels from Python; so does everything
with `cuda_graphs=False` (`--enforce-eager`, vLLM's name). The calibration measures the same
paths, so the simulator predicts what this runner does. On a decode-graph step the "forward" event
span includes the LM head. Steps run under `torch.inference_mode()`, as vLLM's do (no autograd
bookkeeping per op).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pagesim.config import EngineConfig
from pagesim.errors import InternalError
from pagesim.gpu.attention import AttentionMetadata
from pagesim.gpu.cuda_graphs import GraphKey, StepGraphs
from pagesim.gpu.input_buffers import BlockTableRows
from pagesim.gpu.kv_layout import KVLayout
from pagesim.gpu.model import DecoderConfig, KVCache, RandomWeightDecoder, StepMetadata
from pagesim.kvcache.block_table import build_positions
from pagesim.kvcache.sizing import serves_hybrid
from pagesim.scheduler.output import ModelRunnerOutput, SchedulerOutput, sample_synthetic

#: The device phases of a step, in stream order: the spans between its five CUDA events.
DEVICE_PHASES = ("swap", "copy", "forward", "sample")


@dataclass(slots=True)
class StepInputs:
    """Device tensors of one step. `T` = tokens of the step, `S` = scheduled sequences."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    logits_indices: torch.Tensor  # [S] int64, last row of every sequence
    metadata: StepMetadata  # one per KV cache group under the hybrid layout


@dataclass(slots=True)
class StepTiming:
    """One executed step: its shape and where its time went (seconds)."""

    step_id: int
    num_reqs: int
    num_tokens: int
    num_decode_reqs: int
    num_prefill_tokens: int
    context_sum: int  # sum of num_computed_tokens before the step
    prepare_s: float  # host: building and copying the inputs
    swap_s: float  # device: swap-out + swap-in copies
    copy_s: float  # device: copy-on-write copies
    forward_s: float  # device: the forward pass
    sample_s: float  # device: LM head + sampler
    wall_s: float  # the whole execute_model call, host wall clock
    cuda_graph: bool = False  # the forward replayed a CUDA graph
    padded_reqs: int = 0  # the graph's sequences (num_reqs when eager)
    graph_captured: bool = False  # this step captured its graph first (lazy capture)
    padded_tokens: int = 0  # the graph's tokens (num_tokens when eager)
    mixed_graph: bool = False  # the graph was a mixed-step one (not decode-only)


@dataclass(frozen=True)
class RunnerConfig:
    """How a `GPUModelRunner` runs, beside the engine's `EngineConfig` (what it serves).

    `cuda_graphs` (CUDA only) captures the graph steps; with `capture_graphs=False` the
    runner takes the very same padded static-buffer path without capturing, on any device:
    what the CPU tests and the TP dry run check the graph flow with.
    """

    device: torch.device | str = "cuda"
    dtype: torch.dtype = torch.bfloat16  # of a model the runner builds itself
    seed: int = 0  # of a model the runner builds itself
    num_cpu_blocks: int = 0  # pinned CPU blocks for swap preemption (0: no swap cache)
    temperature: float = 1.0
    cuda_graphs: bool = True  # False: `--enforce-eager`, vLLM's name
    capture_graphs: bool = True


class GPUModelRunner:
    """Runs the random-weight model of `config.model` over a paged KV cache.

    `num_gpu_blocks` blocks of `config.block_size` tokens per layer (block 0 is the null
    block). `model` is a model built already (shared across block sizes by a calibration,
    a tensor-parallel shard); without it the runner builds one from `options`.

    A hybrid model served by the hybrid KV cache manager (`sizing.serves_hybrid`) gets the
    hybrid layout (`pagesim.gpu.kv_layout`): one block-table row per KV cache group in each
    request's `block_ids`, layers of a group reading its table, layer i of every group
    sharing one K/V tensor; graph steps carry every group's table and slot mapping.
    """

    def __init__(
        self,
        config: EngineConfig,
        num_gpu_blocks: int,
        options: RunnerConfig | None = None,
        *,
        model: RandomWeightDecoder | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        opts = options or RunnerConfig()
        self.config = config
        self.spec = config.model_spec
        self.device = torch.device(opts.device)
        self.block_size = config.block_size
        self.model = model or RandomWeightDecoder(
            DecoderConfig(self.spec, opts.dtype, self.device, config.block_size, opts.seed)
        )
        if self.model.attn.block_size != config.block_size:
            self.model.set_block_size(config.block_size)
        self.dtype = self.model.dtype
        self.vocab_size = self.spec.vocab_size
        self.temperature = opts.temperature
        on_cuda = self.device.type == "cuda"
        self.num_gpu_blocks = num_gpu_blocks
        self.kv_layout = KVLayout.of(self.spec, serves_hybrid(config))
        self.kv_caches: KVCache = allocate_kv_cache(
            self.model, num_gpu_blocks, self.device, layout=self.kv_layout
        )
        self.num_cpu_blocks = opts.num_cpu_blocks
        self.cpu_caches: KVCache = (
            allocate_kv_cache(
                self.model, opts.num_cpu_blocks, "cpu", pin=on_cuda, layout=self.kv_layout
            )
            if opts.num_cpu_blocks
            else []
        )
        # Every live request's block-table row, kept from the scheduler's block-id deltas;
        # under the hybrid layout one set of rows per KV cache group.
        self.group_block_rows = [
            BlockTableRows(
                table_width(-(-config.max_model_len // config.block_size)), config.max_num_seqs
            )
            for _ in range(self.kv_layout.num_groups)
        ]
        self.step_records: list[StepTiming] = []
        self.record_steps = True
        # Calibration only: run every layer with attention replaced by the identity.
        self.skip_attention = False
        # The last step's inputs and final hidden rows (references only), for the checks of
        # graph against eager and of tensor-parallel ranks against each other.
        self.last_inputs: StepInputs | None = None
        self.last_hidden: torch.Tensor | None = None
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(5)] if on_cuda else None
        self.graphs: StepGraphs | None = None
        if opts.cuda_graphs and not opts.capture_graphs:
            self.graphs = self.make_graphs(capture=False)
        elif opts.cuda_graphs and on_cuda:
            try:
                self.graphs = self.make_graphs(capture=True, log=log)
            except Exception as e:  # a model graphs cannot serve runs eagerly
                if log is not None:
                    log(f"CUDA graphs off for this runner: {type(e).__name__}: {e}")

    def make_graphs(
        self, capture: bool = True, log: Callable[[str], None] | None = None
    ) -> StepGraphs:
        """Static buffers (and graphs, if `capture`) for this runner's graph steps."""
        return StepGraphs(
            self.model,
            self.kv_caches,
            self.config,
            capture=capture,
            num_groups=self.kv_layout.num_groups,
            log=log,
        )

    # ---- the protocol ---------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        t0 = time.perf_counter()
        out = scheduler_output
        hybrid = self.kv_layout.is_hybrid
        tables = [
            (rows, rows.update(out, g if hybrid else None))
            for g, rows in enumerate(self.group_block_rows)
        ]
        key = self._graph_key(out)
        inputs = None
        if key is not None:
            self.graphs.load(out.scheduled, self._input_ids(out.scheduled), key, tables)
        elif out.scheduled:
            inputs = self.prepare_inputs(out)
        t_prep = time.perf_counter() - t0
        ev = self._events
        # One stream lookup per step (each Event.record() without a stream makes its own).
        stream = torch.cuda.current_stream(self.device) if ev is not None else None
        if ev is not None:
            ev[0].record(stream)
        self._swap(out)
        if ev is not None:
            ev[1].record(stream)
        self._copy_blocks(out.blocks_to_copy)
        if ev is not None:
            ev[2].record(stream)
        sampled: dict[str, int] = {}
        captured = False
        logits: torch.Tensor | None = None
        if key is not None:
            try:
                hidden, logits, captured = self.graphs.run(key)
            except Exception:  # capture failed (logged, graphs off): this step runs eagerly
                key, captured = None, True
                inputs = self.prepare_inputs(out)
            else:
                n = len(out.scheduled)
                hidden = hidden[:n]
                self.last_inputs, self.last_hidden = None, hidden
                logits = None if logits is None else logits[:n]
        if inputs is not None:
            hidden = self.model.forward(
                inputs.input_ids,
                inputs.positions,
                inputs.metadata,
                self.kv_caches,
                inputs.logits_indices,
                skip_attention=self.skip_attention,
            )
            self.last_inputs, self.last_hidden = inputs, hidden
        if out.scheduled:
            if ev is not None:
                ev[3].record(stream)
            if logits is None:
                logits = self.model.compute_logits(hidden)
            ids = self.model.sample(logits, self.temperature)
            if ev is not None:
                ev[4].record(stream)
            # The per-step device sync vLLM also makes to read the sampled tokens; every
            # copy and kernel of the step was queued on this stream before it.
            ids.tolist()
            sampled = sample_synthetic(out.scheduled, self.vocab_size)
        else:
            if ev is not None:
                ev[3].record(stream)
                ev[4].record(stream)
            if self.device.type == "cuda":  # a swap-only step: wait for its copies
                torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - t0
        breakdown = self._breakdown(t_prep)
        if self.record_steps:
            self._record(out, breakdown, wall, key, captured)
        return ModelRunnerOutput(
            step_time_s=wall, sampled_token_ids=sampled, time_breakdown_s=breakdown
        )

    def _graph_key(self, out: SchedulerOutput) -> GraphKey | None:
        if self.graphs is None or not out.scheduled:
            return None
        return self.graphs.key_for(out.scheduled, self.skip_attention)

    # ---- inputs -----------------------------------------------------------------------------
    def prepare_inputs(self, out: SchedulerOutput) -> StepInputs:
        """Host-side inputs of a step, on the device (see `StepInputs`); `group_block_rows`
        holds the step's rows already."""
        sched = out.scheduled
        starts = [sr.num_computed_tokens for sr in sched]
        news = [sr.num_new_tokens for sr in sched]
        ids = self._input_ids(sched)
        positions = build_positions(starts, news)
        dev = self.device

        def build(backend, rows: list[list[int]]) -> AttentionMetadata:
            width = table_width(max(len(r) for r in rows))
            return backend.build_metadata(rows, starts, news, dev, max_num_blocks_per_seq=width)

        metadata: StepMetadata
        metadata = tuple(
            build(
                self.model.group_attn(kind),
                [group.block_ids(sr.request.request_id) for sr in sched],
            )
            for kind, group in zip(self.kv_layout.group_kinds, self.group_block_rows, strict=True)
        )
        if not self.kv_layout.is_hybrid:
            metadata = metadata[0]
        first = metadata[0] if isinstance(metadata, tuple) else metadata
        return StepInputs(
            input_ids=torch.tensor(ids, dtype=torch.int64).to(dev, non_blocking=True),
            positions=torch.tensor(positions, dtype=torch.int64).to(dev, non_blocking=True),
            logits_indices=(first.query_start_loc[1:] - 1).to(torch.int64),
            metadata=metadata,
        )

    def _input_ids(self, sched) -> list[int]:
        """Token ids of the step's new tokens, sequences in order (ids modulo the vocab)."""
        vocab = self.vocab_size
        ids: list[int] = []
        for sr in sched:
            req, start, n = sr.request, sr.num_computed_tokens, sr.num_new_tokens
            num_prompt = len(req.prompt_token_ids)
            if n == 1 and start >= num_prompt:  # decode: the last sampled token
                ids.append(req.output_token_ids[start - num_prompt] % vocab)
            else:
                ids.extend(t % vocab for t in req.token_ids_slice(start, start + n))
        return ids

    # ---- block movement ---------------------------------------------------------------------
    def _swap(self, out: SchedulerOutput) -> None:
        """Swap-out (GPU -> CPU) then swap-in (CPU -> GPU), every layer, K and V."""
        if not (out.blocks_to_swap_out or out.blocks_to_swap_in):
            return
        if not self.cpu_caches:
            raise InternalError(
                "the scheduler asked for swaps but the runner has no CPU cache (num_cpu_blocks=0)"
            )
        if out.blocks_to_swap_out:
            src, dst = _index_pair(out.blocks_to_swap_out)
            src_d = src.to(self.device)
            for (gk, gv), (ck, cv) in zip(self.kv_caches, self.cpu_caches, strict=False):
                ck[dst] = gk.index_select(0, src_d).cpu()
                cv[dst] = gv.index_select(0, src_d).cpu()
        if out.blocks_to_swap_in:
            src, dst = _index_pair(out.blocks_to_swap_in)
            dst_d = dst.to(self.device)
            for (gk, gv), (ck, cv) in zip(self.kv_caches, self.cpu_caches, strict=False):
                gk.index_copy_(0, dst_d, ck.index_select(0, src).to(self.device, non_blocking=True))
                gv.index_copy_(0, dst_d, cv.index_select(0, src).to(self.device, non_blocking=True))

    def _copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block `src` -> block `dst` in every layer's K and V."""
        if not pairs:
            return
        src, dst = _index_pair(pairs)
        src, dst = src.to(self.device), dst.to(self.device)
        for k, v in self.kv_caches:
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))

    # ---- timing -----------------------------------------------------------------------------
    def _breakdown(self, prepare_s: float) -> dict[str, float]:
        ev = self._events
        if ev is None:
            return {"prepare": prepare_s}
        spans = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(4)]
        return {"prepare": prepare_s, **dict(zip(DEVICE_PHASES, spans, strict=True))}

    def _record(
        self,
        out: SchedulerOutput,
        b: dict[str, float],
        wall: float,
        key: GraphKey | None,
        captured: bool,
    ) -> None:
        num_decode = out.num_decodes
        self.step_records.append(
            StepTiming(
                out.step_id,
                len(out.scheduled),
                out.total_num_scheduled_tokens,
                num_decode,
                out.total_num_scheduled_tokens - num_decode,
                sum(sr.num_computed_tokens for sr in out.scheduled),
                b["prepare"],
                b.get("swap", 0.0),
                b.get("copy", 0.0),
                b.get("forward", 0.0),
                b.get("sample", 0.0),
                wall,
                key is not None,
                len(out.scheduled)
                if key is None
                else (self.graphs.mixed_seqs(key.size) if key.mixed else key.size),
                captured,
                key.size if key is not None else out.total_num_scheduled_tokens,
                key is not None and key.mixed,
            )
        )


#: Block-table rows are padded to a multiple of this many entries.
TABLE_WIDTH_MULTIPLE = 16


def step_record_columns(records: list[StepTiming]) -> dict[str, list]:
    """`StepTiming`s as JSON-ready columns (field name -> one value per step)."""
    names = StepTiming.__dataclass_fields__
    return {name: [getattr(r, name) for r in records] for name in names}


def table_width(longest_row: int) -> int:
    """Block-table width for a step: the longest row rounded up to a multiple of 16.

    Triton specializes a kernel on each integer argument being 1 or a multiple of 16; the
    table's row stride is one, so an unpadded width made a new compile, in the middle of served
    steps, whenever a step's longest row crossed into a new
    class. Padding keeps one class, for a few padded entries per row (vLLM pads every row to
    max_model_len / block_size).
    """
    m = TABLE_WIDTH_MULTIPLE
    return max(m, -(-longest_row // m) * m)


def allocate_kv_cache(
    model: RandomWeightDecoder,
    num_blocks: int,
    device: torch.device | str,
    pin: bool = False,
    layout: KVLayout | None = None,
) -> KVCache:
    """Per layer (key, value) caches `[num_blocks, block_size, num_kv_heads, head_size]`.

    One allocation for all layers (so the memory is contiguous and counted once); block 0 is
    the null block that padded block-table entries point at. Under a hybrid `layout` the
    layers that share a tensor get the same pair (default: one tensor per layer).
    """
    layout = layout or KVLayout.of(model.spec, hybrid_kv_cache_manager=False)
    shape = model.attn.kv_cache_shape(num_blocks)
    tensors = layout.num_tensors
    whole = torch.empty((tensors, 2, *shape), dtype=model.dtype, device=device, pin_memory=pin)
    # Zeroed once (~40 ms for 115 GB on an H200): kernels read the unwritten tail of a
    # sequence's last block (masked, but 0 * NaN is NaN), so leftover bits must be finite.
    whole.zero_()
    return [(whole[t, 0], whole[t, 1]) for t in layout.layer_tensor]


def _index_pair(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.tensor([p[0] for p in pairs], dtype=torch.int64)
    dst = torch.tensor([p[1] for p in pairs], dtype=torch.int64)
    return src, dst
