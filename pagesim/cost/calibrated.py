"""The calibrated cost model: interpolation over a measured `Profile`, then its corrections.

A step is priced as

    other(mode, total tokens)                  non-attention time (GEMMs, norms, sampling, ...)
  + decode(block size, batch, mean context)    the decode group's residual
  + sum of prefill(block size, new, cached)    one residual per prefill entry
  + host overhead(num_reqs)                    overhead.csv, if measured, plus the extra of a
                                               step that admits prompts
  + swap bytes / host link, copy-on-write copies
  + all-reduces (TP > 1)                       only for a profile timed on one rank's shard

with the corrections of `pagesim.cost.corrections` fitted on top, in their order, each of
which can be switched off (`disabled_corrections`).

The grid. `other` is piecewise linear in tokens through the median `other_ms` of the rows with
that token count; a row's residual is its step time less other(its tokens), so a pure decode
or single-prefill grid point is reproduced. Each residual surface (decode: batch, mean
context; prefill: new, cached tokens) is a backbone on the kernels' work terms plus the
measured deviation from it (`pagesim.cost.surface`). Block sizes between measured ones
interpolate linearly in log2(block size); outside the measured range the nearest is used.
The total is never negative.

CUDA graphs. A decode-only step of n sequences replays the graph of the smallest captured size
P >= n (`cuda_graph_sizes`) and is priced at the grid point of P, but for an MoE model's
`other` at n + 1: the P - n padding rows all hold one token, which routes to one top-k set of
experts, so the routed weights a padded step reads follow its real rows plus one, not P
(a grid point has no padding rows and routes all P). With mixed graphs
(`cuda_graph_token_sizes`) every other step of T tokens replays the graph of the smallest size
T' >= T, and its `other` is other(T'), from a line through the graph rows alone: a graph
replay and an eager step of equal tokens differ by the Python launches. Larger steps run
eagerly at their own size. All-reduces (TP > 1): `pagesim.cost.allreduce_pricing`; step rows
timed on the whole group hold them already, and they are reported apart, carved out of
`other`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Sequence

from pagesim.cost import corrections
from pagesim.cost.allreduce_pricing import allreduce_pricer
from pagesim.cost.analytical import AnalyticalConstants, kv_dtype_bytes
from pagesim.cost.base import BatchShape, OneKindShapes, longest_context
from pagesim.cost.corrections import varlen
from pagesim.cost.corrections.drift import section_drift_ms
from pagesim.cost.corrections.multi_part import fit_shared
from pagesim.cost.corrections.prefill_bias import PrefillBias, single_prefill_bias
from pagesim.cost.corrections.reread import fit_decode_reread, fit_varlen_reread
from pagesim.cost.corrections.spread import DecodeKernel, fit_decode_spread
from pagesim.cost.profile import DecodeRow, Profile
from pagesim.cost.profile_rows import row_shapes
from pagesim.cost.surface import Pwl, Surface, blend_weights
from pagesim.cost.varlen_launch import VarlenKernel, shape_launch
from pagesim.errors import ConfigError, PagesimError
from pagesim.specs import GPUSpec, ModelSpec

MS = 1e-3
BREAKDOWN_KEYS: tuple[str, ...] = (
    "other",
    "attention",
    "allreduce",
    "host_overhead",
    "swap",
    "copy",
)


def _routes_experts(model: ModelSpec | None, name: str) -> bool:
    """Whether the profile's model is MoE (`model`, else the profile's model by name; a
    model pagesim does not know, such as a synthetic profile's, is priced as dense)."""
    if model is None:
        try:
            model = ModelSpec.from_name(name)
        except PagesimError:
            return False
    return model.is_moe


class CalibratedCostModel(OneKindShapes):
    """Step times from a measured profile (see the module docstring for the decomposition).

    `model` (optional) is checked against the profile's model and, with `gpu`, prices
    copy-on-write block copies; swaps use the profile's measured host-link rate, else `gpu`'s
    datasheet rate times `AnalyticalConstants.host_link_efficiency`. A step that needs a rate
    nobody gave raises `ConfigError` rather than costing it as zero. `tensor_parallel_size`
    (optional) must equal the profile's: step times of one TP degree say nothing of another.
    `disabled_corrections` names corrections to leave off (`pagesim.cost.corrections`);
    `corrections` lists those on, in their order, and `fits` what they fitted.
    """

    def __init__(
        self,
        profile: Profile,
        model: ModelSpec | None = None,
        gpu: GPUSpec | None = None,
        tensor_parallel_size: int | None = None,
        disabled_corrections: Iterable[str] = (),
    ):
        meta = profile.metadata
        if model is not None and model.name != meta.model:
            raise ConfigError(f"model={model.name!r}: the profile was measured on {meta.model!r}")
        if gpu is not None and gpu.name != meta.gpu:
            raise ConfigError(f"gpu={gpu.name!r}: the profile was measured on {meta.gpu!r}")
        if tensor_parallel_size is not None and tensor_parallel_size != meta.tensor_parallel_size:
            raise ConfigError(
                f"tensor_parallel_size={tensor_parallel_size}: the profile was "
                f"measured at tensor_parallel_size={meta.tensor_parallel_size}"
            )
        on = corrections.enabled_corrections(disabled_corrections)
        self.corrections = tuple(name for name in corrections.CORRECTIONS if name in on)
        self.profile = profile
        self._allreduce, self.allreduce_source = allreduce_pricer(profile, model, gpu)
        self._allreduce_added = not meta.allreduce_in_step_times
        self._graph_sizes = tuple(meta.cuda_graph_sizes)
        self._routes_experts = _routes_experts(model, meta.model)
        self._token_sizes = tuple(meta.cuda_graph_token_sizes)
        rows = row_shapes(profile)
        # ---- the grid: `other` lines and residual surfaces, rows less their drift
        self._drift_ms = section_drift_ms(rows, "drift" in on)  # row -> its section's drift
        other: dict[bool, dict[float, list[float]]] = {
            True: defaultdict(list),
            False: defaultdict(list),
        }
        for _, tokens, row in rows:
            # a graph row ran its graph at the padded size: that is the size it measured
            graph = self._is_graph_row(row, tokens)
            size = (
                self.padded_tokens(tokens) if graph and not isinstance(row, DecodeRow) else tokens
            )
            other[graph][size].append((row.other_ms - self._drift_ms[row]) * MS)  # type: ignore[index]  # a graph row has a padded size
        if not self._token_sizes or not other[False] or not other[True]:
            merged: dict[float, list[float]] = defaultdict(list)
            for table in other.values():
                for x, ys in table.items():
                    merged[x].extend(ys)
            self._other_graph = self._other_eager = Pwl(merged)
        else:
            self._other_graph, self._other_eager = Pwl(other[True]), Pwl(other[False])
        dec: dict[int, list] = defaultdict(list)
        pre: dict[int, list] = defaultdict(list)
        for kind, tokens, r in rows:
            if kind not in ("decode", "prefill"):
                continue
            residual = self._measured_s(r) - self._other_for(self._is_graph_row(r, tokens), tokens)
            if kind == "decode":
                dec[r.block_size].append((r.batch_size, r.context_len, residual))
            else:
                pre[r.block_size].append((r.num_new_tokens, r.num_cached_tokens, residual))
        self._decode = {bs: Surface(p, prefill=False) for bs, p in sorted(dec.items())}
        self._prefill = {bs: Surface(p, prefill=True) for bs, p in sorted(pre.items())}
        # Per-step memos (speed only: the same arithmetic, done once per key):
        self._decode_blend: dict[int, tuple] = {}  # block size -> blend_weights(_decode)
        self._prefill_blend: dict[int, tuple] = {}  # block size -> blend_weights(_prefill)
        self._reread_frac: dict[int, float] = {}  # block size -> blended re-read fraction
        self._reread_varlen_frac: dict[int, float] = {}  # the same, variable-length kernel
        self._varlen_blend: dict[int, tuple] = {}  # block size -> blend_weights(_varlen)
        self._decode_base: dict[int, tuple] = {}  # decode-only n -> (graph, padded n, other)
        self._host_memo: dict[int, float] = {}  # requests in the batch -> host overhead (s)
        self._spread_frac: dict[int, float] = {}  # block size -> blended spread cost
        self._bias_blend: dict[int, tuple] = {}  # block size -> blend_weights(_prefill_bias)
        # ---- the corrections, in `corrections.CORRECTIONS` order; each is off (its empty
        # value, which `_parts` skips) until fitted, so each fit sees the ones before it only
        self._shared = {True: 0.0, False: 0.0}  # multi_part: graph mode -> seconds
        self._varlen_kernel: VarlenKernel | None = None
        self._varlen: dict = {}  # varlen: block size -> VarlenFit
        self._spread: dict[int, float] = {}  # spread: block size -> seconds per token
        self._reread: dict[int, float] = {}  # reread: block size -> fraction (decode kernel)
        self._reread_varlen: dict[int, float] = {}  # reread: the same, variable-length kernel
        self._prefill_bias: dict[int, PrefillBias] = {}  # prefill_bias: block size -> line
        if "multi_part" in on:
            residuals = [
                z for s in (*self._decode.values(), *self._prefill.values()) for z in s.values
            ]
            self._shared = fit_shared(self, rows, max(min(residuals), 0.0))
        if "varlen" in on:
            self._varlen_kernel, self._varlen = varlen.fit(self, rows)
        self._decode_kernel = DecodeKernel.of(profile)
        if "spread" in on:
            self._spread = fit_decode_spread(self, profile, self._decode_kernel)
        if "reread" in on:
            self._reread = fit_decode_reread(self, profile)  # its spread rows need `_spread`
            self._reread_varlen = fit_varlen_reread(self, profile)
        if "prefill_bias" in on and self._varlen:  # what the finished fit leaves on its rows
            self._prefill_bias = single_prefill_bias(
                rows,
                lambda tokens: self.padded_tokens(tokens) is None,
                self._measured_s,
                lambda shape: self._parts(shape)[0],
            )
        # ---- host time, swaps and copies
        overhead: dict[float, list[float]] = {
            r.num_reqs: [r.overhead_ms * MS] for r in profile.overhead
        }
        self._host = Pwl(overhead) if overhead else None
        # host time of a step that admits prompts, beyond the decode-only line (format 6)
        self._admit_step_s = (meta.overhead_prefill_step_ms or 0.0) * MS
        self._admit_entry_s = (meta.overhead_per_prefill_ms or 0.0) * MS
        self._swap_s_per_byte = self._copy_s_per_token = None
        host = meta.host_link_bytes_per_s or (
            gpu.host_link_bytes_per_s * AnalyticalConstants().host_link_efficiency
            if gpu is not None
            else None
        )
        if host:
            self._swap_s_per_byte = 1.0 / host
        if model is not None and gpu is not None:
            heads = max(1, model.num_kv_heads // meta.tensor_parallel_size)
            kv = 2 * model.num_layers * heads * model.head_size
            kv *= kv_dtype_bytes(model, meta.kv_cache_dtype)
            read = gpu.hbm_bandwidth_bytes_per_s * AnalyticalConstants().weight_bandwidth_efficiency
            self._copy_s_per_token = 2.0 * kv / read

    # ---- public API ----
    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one step: never negative; see `step_time_breakdown`."""
        return sum(self._components(batch))

    def device_time(self, batch: BatchShape) -> float:
        """Seconds of the step itself (`GPUModelRunner.execute_model`): the step time less
        the host time between steps, what a real run's per-step records compare with."""
        parts = self.step_time_breakdown(batch)
        return sum(parts.values()) - parts["host_overhead"]

    def step_time_breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per component, keyed by `BREAKDOWN_KEYS` ("attention" holds every residual
        after the shared-cost correction, so it can include per-sequence non-GEMM work)."""
        return dict(zip(BREAKDOWN_KEYS, self._components(batch), strict=True))

    def padded_batch(self, num_decode_seqs: int) -> int:
        """The batch a decode-only step of `num_decode_seqs` runs at: the smallest captured
        CUDA-graph size >= it, or itself when graphs were off or it exceeds every size."""
        sizes = self._graph_sizes
        if not sizes or num_decode_seqs > sizes[-1]:
            return num_decode_seqs
        return sizes[bisect_left(sizes, num_decode_seqs)]

    # ---- the model ----
    def _components(self, b: BatchShape) -> tuple[float, float, float, float, float, float]:
        swap = copy = 0.0
        if b.swap_bytes:
            if self._swap_s_per_byte is None:
                raise ConfigError(
                    "swap_bytes>0: the profile has no host_link_bytes_per_s; "
                    "pass gpu= to price swaps"
                )
            swap = b.swap_bytes * self._swap_s_per_byte
        if b.num_blocks_to_copy:
            if self._copy_s_per_token is None:
                raise ConfigError(
                    "num_blocks_to_copy>0: pass model= and gpu= to price copy-on-write copies"
                )
            copy = b.num_blocks_to_copy * b.block_size * self._copy_s_per_token
        if not b.total_tokens:
            return 0.0, 0.0, 0.0, 0.0, swap, copy
        return (
            *self._device_and_host(
                *self._parts(b),
                b.total_tokens,
                b.num_decode_seqs + len(b.prefill_new_tokens),
                len(b.prefill_new_tokens),
            ),
            swap,
            copy,
        )

    def decode_step_time(
        self,
        block_size: int,
        num_seqs: int,
        context_sum: int,
        contexts: Sequence[int],
        shared: int | None = None,
    ) -> float:
        """`step_time` of `num_seqs` (>= 1) decodes and nothing else over `contexts` (their sum
        `context_sum`), `shared` of them in shared blocks (None: unknown), without a
        `BatchShape` (the simulator's steps of bulk decodes); `step_time` of such a shape runs
        this."""
        other, attention, allreduce, host = self._device_and_host(
            *self._decode_parts(block_size, num_seqs, context_sum, contexts, shared),
            num_seqs,
            num_seqs,
            0,
        )
        return other + attention + allreduce + host

    def _device_and_host(
        self, total: float, other: float, tokens: int, num_reqs: int, num_prefills: int
    ) -> tuple[float, float, float, float]:
        """(other, attention, allreduce, host) of a step whose `_parts` are (total, other)."""
        attention = total - other  # may be < 0 where `other` over-explains a row; total is not
        if total < 0.0:  # a noisy profile extrapolated below zero: clamp, never negative
            other = attention = 0.0
        allreduce = self._allreduce(tokens) if self._allreduce is not None else 0.0
        if not self._allreduce_added:  # already inside the measured steps: report it apart
            allreduce = min(allreduce, max(other, 0.0))
            other -= allreduce
        host = 0.0
        if self._host:
            host = self._host_memo.get(num_reqs)  # type: ignore[assignment]  # None: not yet memoized
            if host is None:
                host = self._host_memo[num_reqs] = self._host(num_reqs)
            if num_prefills:
                host += self._admit_step_s + self._admit_entry_s * num_prefills
        return other, attention, allreduce, host

    def padded_tokens(self, num_tokens: int) -> int | None:
        """The token count a step with prefill entries runs its mixed graph at, or None when
        it runs eagerly (no mixed graphs, or more tokens than the largest size)."""
        sizes = self._token_sizes
        if not sizes or num_tokens > sizes[-1]:
            return None
        return sizes[bisect_left(sizes, num_tokens)]

    def _is_graph_row(self, row, tokens: int) -> bool:
        """Whether the runner replayed a graph for a calibration row of `tokens` tokens."""
        if isinstance(row, DecodeRow):
            return self._decode_graph(row.batch_size)
        return bool(self._token_sizes) and tokens <= self._token_sizes[-1]

    def _measured_s(self, row) -> float:
        """A step row's time in seconds, less its block size's drift in the non-attention
        part (`section_drift_ms`)."""
        return (row.step_time_ms - self._drift_ms[row]) * MS

    def _other_for(self, graph: bool, tokens: float) -> float:
        return (self._other_graph if graph else self._other_eager)(tokens)

    def _discounted(self, launch, b: BatchShape, reread: float | None = None):
        """`launch` (the shape's own, `shape_launch`) with its shared-prefix reads discounted:
        `reread` is the fraction to use (default the fitted one; none without rows or without
        the shared count). The re-read fit prices one launch at many fractions."""
        shared = b.shared_context_tokens
        if not shared:
            return launch
        if reread is None:
            if not self._reread_varlen:
                return launch
            reread = self._blended(self._reread_varlen_frac, self._reread_varlen, b.block_size)
        context = b.decode_context_sum + sum(b.prefill_context_tokens)
        if context == 0:
            return launch
        return launch.reread(min(shared, context) / context, reread)

    def _decode_graph(self, n: int) -> bool:
        return bool(self._graph_sizes) and n <= self._graph_sizes[-1]

    @property
    def fits(self) -> dict[str, dict]:
        """Each correction's fitted values, empty where it is off or had nothing to fit on:
        `multi_part` graph mode -> seconds; by block size, `varlen` -> `VarlenFit`, `spread`
        -> seconds per token of (longest - mean) program length, `reread` -> fraction in the
        decode kernel, `reread_varlen` -> in the variable-length one, `prefill_bias` ->
        `PrefillBias` (the one-prefill eager step's factor less 1, by its new tokens)."""
        return {
            "multi_part": dict(self._shared),
            "varlen": dict(self._varlen),
            "spread": dict(self._spread),
            "reread": dict(self._reread),
            "reread_varlen": dict(self._reread_varlen),
            "prefill_bias": dict(self._prefill_bias),
        }

    @property
    def reread_fraction(self) -> dict[int, float]:
        """Block size -> cost of re-reading a shared block (`corrections.reread`); empty when
        the profile has no shared-prefix rows."""
        return dict(self._reread)

    @staticmethod
    def _blended(memo: dict[int, float], fitted: dict[int, float], block_size: int) -> float:
        """A per-block-size fitted value at `block_size` (`blend_weights` of the measured
        ones), kept in `memo` after its first use."""
        value = memo.get(block_size)
        if value is None:
            value = memo[block_size] = sum(w * f for w, f in blend_weights(fitted, block_size))
        return value

    @staticmethod
    def _memo_weights(memo: dict[int, tuple], fitted: dict, block_size: int) -> tuple:
        """`blend_weights(fitted, block_size)` of per-block-size fits (callables), kept in
        `memo` after its first use (`fitted` is set once, after which it is only read)."""
        weights = memo.get(block_size)
        if weights is None:
            weights = memo[block_size] = blend_weights(fitted, block_size)
        return weights

    def _decode_work(
        self, block_size: int, context_sum: int, shared: int | None, reread: float | None
    ) -> float:
        """Context tokens a decode group reads, its shared-block reads at their re-read cost
        (`reread`, default the fitted one; `pagesim.cost.corrections.reread`)."""
        work: float = context_sum
        if shared and (self._reread or reread is not None):
            frac = (
                reread
                if reread is not None
                else self._blended(self._reread_frac, self._reread, block_size)
            )
            work -= (1.0 - frac) * min(shared, context_sum)
        return work

    def _decode_parts(
        self,
        block_size: int,
        num_seqs: int,
        context_sum: int,
        contexts: Sequence[int],
        shared: int | None,
        reread: float | None = None,
    ) -> tuple[float, float]:
        """`_parts` of a decode-only step: at its CUDA graph's padded batch, if any; with
        spread rows, the real sequences' work over the padded rows plus the unequal programs
        (`pagesim.cost.corrections.spread`)."""
        weights = self._memo_weights(self._decode_blend, self._decode, block_size)
        base = self._decode_base.get(num_seqs)
        if base is None:
            graph = self._decode_graph(num_seqs)
            padded = self.padded_batch(num_seqs)  # itself when it runs eagerly
            routed = min(padded, num_seqs + 1) if self._routes_experts else padded
            base = self._decode_base[num_seqs] = (graph, padded, self._other_for(graph, routed))
        graph, n, other = base
        total = other
        spread = self._spread
        work = self._decode_work(block_size, context_sum, shared, reread) if shared else context_sum
        c = work / (n if spread else num_seqs)
        for w, s in weights:
            total += w * s(n, c)
        if spread:
            kappa = self._blended(self._spread_frac, spread, block_size)
            total += kappa * self._decode_kernel.program_spread(  # type: ignore[union-attr]
                n, graph, context_sum / num_seqs, longest_context(contexts)
            )
        return total, other

    def _parts(self, b: BatchShape, reread: float | None = None) -> tuple[float, float]:
        """(device time, its `other` share) before clamping; `reread` prices a decode-only
        step's shared-block reads at that fraction instead of the fitted one (for the fit)."""
        if not b.prefill_new_tokens:
            return self._decode_parts(
                b.block_size,
                b.num_decode_seqs,
                b.decode_context_sum,
                b.decode_context_tokens,
                b.shared_context_tokens,
                reread,
            )
        padded = self.padded_tokens(b.total_tokens)
        graph = padded is not None
        total = other = self._other_for(graph, padded if padded is not None else b.total_tokens)
        if self._varlen:
            launch = self._discounted(shape_launch(self._varlen_kernel, b, padded), b)  # type: ignore[arg-type]  # set with `_varlen`
            total += sum(
                w * fit(launch, graph)
                for w, fit in self._memo_weights(self._varlen_blend, self._varlen, b.block_size)
            )
            if not graph and len(b.prefill_new_tokens) == 1 and self._prefill_bias:
                new = b.prefill_new_tokens[0]
                total *= 1.0 + sum(
                    w * bias(new)
                    for w, bias in self._memo_weights(
                        self._bias_blend, self._prefill_bias, b.block_size
                    )
                )
            return total, other
        # per-entry residuals, less the fixed cost every part but one carries (multi_part)
        dec_w = self._memo_weights(self._decode_blend, self._decode, b.block_size)
        pre_w = self._memo_weights(self._prefill_blend, self._prefill, b.block_size)
        n = b.num_decode_seqs
        parts = 0
        if n:
            c = (
                self._decode_work(
                    b.block_size, b.decode_context_sum, b.shared_context_tokens, reread
                )
                / n
            )
            for w, s in dec_w:
                total += w * s(n, c)
            parts = 1
        for q, ctx in zip(b.prefill_new_tokens, b.prefill_context_tokens, strict=True):
            for w, s in pre_w:
                total += w * s(q, ctx)
            parts += 1
        if parts > 1:
            total -= (parts - 1) * self._shared[graph]
        return total, other
