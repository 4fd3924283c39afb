"""The transfer cost model: a profile measured on one GPU, carried to another part by part.

The calibrated model of the source GPU (`CalibratedCostModel`) prices a step and splits it into
its measured parts; each part is scaled by the ratio, target over source, of the time the
rate that bounds it gives:

    other       GEMMs, norms, element-wise kernels, LM head: the ratio of the two GPUs'
                kernel-by-kernel rooflines (`pagesim.cost.operations`) at the step's tokens,
                each kernel memory- or compute-bound by its arithmetic intensity against each
                GPU's ridge point, plus a fixed latency per kernel. What the measured `other`
                holds beyond the kernels' rooflines and latencies (`unlisted_s`) stays as
                measured: no rate of the card bounds it (launch gaps of eager steps, the
                runner's unvectorized element-wise passes at large steps), and on an H100 the
                steps that hold most of it ran at the H200's speed
    attention   the part of the measured attention that the analytical model's attention
                roofline (paged decode reads, prefill FLOPs, each entry in its own regime)
                explains, by that roofline's ratio; the rest (launch and latency, most of a
                small decode's or a mixed step's attention) stays as measured, as `other`'s does
    allreduce   each measured all-reduce by `carried_allreduce_s`: its per-call time (the
                smallest time the source's all-reduce table measured) stays, the rest (the
                bytes term) moves by the ratio of the bus bandwidths NCCL reaches on the two
                GPUs' links (a published figure where known, else the datasheet link rate
                times the source's share). The same function carries the all-reduce tables
                in the Vidur check (benchmarks/transfer_vs_vidur.py)
    host        unchanged: the scheduler and input preparation run on the CPU
    swap, copy  the analytical model's on the target (host link, HBM copies)

Rates are achievable rates (`pagesim.cost.gpu_rates`): measured ones where known, else the
datasheet times the analytical model's shares. The kernel latency is the source profile's own:
what its smallest step (one token) spends beyond its kernels' rooflines, per kernel.

So a memory-bound decode step of a 7B model moves with the HBM bandwidth and a long prefill
with the tensor rate; a GEMM that is memory-bound on an H200 (ridge ~200 FLOP/byte) can be
compute-bound on an A100 (~150), and is priced so.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pagesim.cost.allreduce_pricing import allreduce_per_call_s, allreduce_table
from pagesim.cost.analytical import (
    AnalyticalConstants,
    AnalyticalCostModel,
    num_allreduces_per_step,
)
from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import BREAKDOWN_KEYS, CalibratedCostModel
from pagesim.cost.gpu_rates import BoundingRates
from pagesim.cost.operations import (
    LayerWidths,
    kernel_time,
    num_kernels,
    step_operations,
    total_time,
)
from pagesim.errors import ConfigError
from pagesim.specs import GPUSpec, ModelSpec

#: The GPU whose shipped profiles are carried to others.
SOURCE_GPU = "h200"


def rated_spec(gpu: GPUSpec, rates: BoundingRates, c: AnalyticalConstants) -> GPUSpec:
    """`gpu` with datasheet rates such that the analytical model's shares of them are the
    achievable `rates`: the analytical attention and all-reduce terms then see them (the
    all-reduce's link is NVLink where the card has it, else the host link)."""
    link = rates.link_bytes_per_s / c.allreduce_bandwidth_efficiency
    nvlink = gpu.nvlink_bytes_per_s > 0
    return replace(
        gpu,
        hbm_bandwidth_bytes_per_s=rates.memory_bytes_per_s / c.weight_bandwidth_efficiency,
        fp16_flops=rates.gemm_flops / c.gemm_flops_efficiency,
        nvlink_bytes_per_s=link if nvlink else 0.0,
        host_link_bytes_per_s=gpu.host_link_bytes_per_s if nvlink else link,
    )


def ring_share(gpus: int) -> float:
    """Bytes each GPU sends per byte of message in a ring all-reduce of `gpus` GPUs,
    2 (n - 1) / n: NCCL's bus bandwidth is message bytes / time times this."""
    return 2.0 * (gpus - 1) / gpus


def carried_allreduce_s(
    measured_s: float,
    per_call_s: float,
    source: BoundingRates,
    target: BoundingRates,
    source_gpus: int,
    target_gpus: int | None = None,
) -> float:
    """One all-reduce measured at `measured_s` on `source_gpus` GPUs of the source, on
    `target_gpus` (default the same number) of the target: the one way pagesim carries an
    all-reduce between GPUs, for the transfer model's steps and for the Vidur check alike.

    The per-call time `per_call_s` (what the source's smallest messages took: launch and
    NCCL's protocol, no bytes to speak of) stays, as host time does; what the call took beyond
    it is the bytes term, and moves by the ratio of the bus bandwidths NCCL reaches on the two
    links (`BoundingRates.link_bytes_per_s`) and, for another number of GPUs, by the ratio of
    the ring's bytes per GPU (`ring_share`), at the same bus bandwidth. A time below the
    per-call time (a step whose measured all-reduces were clipped) is kept as it is.
    """
    n = source_gpus if target_gpus is None else target_gpus
    fixed = min(measured_s, per_call_s)
    ratio = source.link_bytes_per_s / target.link_bytes_per_s
    return fixed + (measured_s - fixed) * ratio * ring_share(n) / ring_share(source_gpus)


def kernel_latency_s(widths: LayerWidths, rates: BoundingRates, other_s: float) -> float:
    """The per-kernel latency that makes a one-token step's kernels take `other_s`, its
    measured time (0 when their rooflines alone take longer)."""
    ops = step_operations(widths, 1, 1)
    return max(other_s - total_time(ops, rates), 0.0) / num_kernels(ops)


class TransferCostModel:
    """`source` (a calibrated model of `model` on `source_gpu`) carried to `target_gpu`.

    `step_time_breakdown` has the calibrated model's keys; `kernel_times(tokens, reqs)` gives
    the per-kernel times on both GPUs that the `other` ratio is made of.
    """

    def __init__(
        self,
        source: CalibratedCostModel,
        model: ModelSpec,
        source_gpu: GPUSpec,
        target_gpu: GPUSpec,
        tensor_parallel_size: int = 1,
        kv_cache_dtype: str = "auto",
    ):
        if model.arch not in ("llama", "opt"):
            raise ConfigError(f"model={model.name!r}: no kernel inventory for arch {model.arch}")
        c = AnalyticalConstants()
        self.source, self.model = source, model
        self.source_gpu, self.target_gpu = source_gpu, target_gpu
        self.source_rates = BoundingRates.of(source_gpu, c)
        self.target_rates = BoundingRates.of(target_gpu, c)
        self.widths = LayerWidths.of(model, tensor_parallel_size)
        tp, kv = tensor_parallel_size, kv_cache_dtype
        self._src_analytical = AnalyticalCostModel(
            model, rated_spec(source_gpu, self.source_rates, c), tp, kv
        )
        self._tgt_analytical = AnalyticalCostModel(
            model, rated_spec(target_gpu, self.target_rates, c), tp, kv
        )
        self._swap_copy = AnalyticalCostModel(model, target_gpu, tp, kv)
        # the source's all-reduces: its measured table where it has one (else the analytical
        # term on the source GPU, as the calibrated model prices them) and their per-call time
        self.tensor_parallel_size = tp
        self.num_allreduces = num_allreduces_per_step(model, tp)
        self._allreduce_table = allreduce_table(source.profile, tp) if tp > 1 else None
        per_call = allreduce_per_call_s(source.profile, tp) if tp > 1 else None
        self.allreduce_per_call_s = c.allreduce_latency_s if per_call is None else per_call
        self._src_allreduce = AnalyticalCostModel(model, source_gpu, tp, kv)
        smallest = source.step_time_breakdown(BatchShape.decode(1, 1))
        # `other` is without the all-reduces (priced apart, by their own ratio)
        self.latency_s = kernel_latency_s(self.widths, self.source_rates, smallest["other"])
        self._inventory_s: dict[tuple[int, int], tuple[float, float]] = {}  # (tokens, reqs)

    # ---- public API ----
    def step_time(self, batch: BatchShape) -> float:
        """Seconds for one step; the sum of `step_time_breakdown`'s values."""
        return sum(self.step_time_breakdown(batch).values())

    def step_time_breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per component on the target GPU, keyed by the calibrated model's
        `BREAKDOWN_KEYS`."""
        moves = batch.swap_bytes or batch.num_blocks_to_copy
        plain = replace(batch, swap_bytes=0, num_blocks_to_copy=0) if moves else batch
        src = self.source.step_time_breakdown(plain)
        out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
        tokens = batch.total_tokens
        if tokens:
            out["other"] = self.other_on_target(src["other"], tokens, batch.num_reqs)
            out["attention"] = self.attention_on_target(src["attention"], batch)
            out["allreduce"] = self.allreduce_on_target(src["allreduce"])
            out["host_overhead"] = src["host_overhead"]
        if moves:
            mine = self._swap_copy.step_time_breakdown(batch)
            out["swap"], out["copy"] = mine["swap"], mine["copy"]
        return out

    def allreduce_on_target(self, measured_s: float) -> float:
        """A step's all-reduces, `measured_s` on the source, on the target: each of the step's
        `num_allreduces` carried by `carried_allreduce_s`."""
        n = self.num_allreduces
        if not n or measured_s <= 0.0:
            return 0.0
        return n * self._carry(measured_s / n, self.tensor_parallel_size)

    def allreduce_call_s(self, message_bytes: float, gpus: int | None = None) -> float:
        """One all-reduce of `message_bytes` on `gpus` GPUs of the target (default the TP
        size): the source's measured time of that message at its TP size, carried by
        `carried_allreduce_s`. A step's all-reduces are `num_allreduces` of these at
        `tokens * hidden * dtype bytes`."""
        if self.tensor_parallel_size == 1:
            raise ConfigError("tensor_parallel_size=1: the source measured no all-reduce")
        if self._allreduce_table is not None:
            measured = self._allreduce_table(message_bytes)
        else:  # as the calibrated model prices a profile without a table
            src = self._src_allreduce
            tokens = message_bytes / src.allreduce_bytes_per_token
            measured = src.allreduce_time(tokens) / src.num_allreduces  # type: ignore[arg-type]
        return self._carry(measured, gpus or self.tensor_parallel_size)

    def _carry(self, measured_s: float, gpus: int) -> float:
        return carried_allreduce_s(
            measured_s,
            self.allreduce_per_call_s,
            self.source_rates,
            self.target_rates,
            self.tensor_parallel_size,
            gpus,
        )

    def allreduce_share(self) -> float:
        """The largest share of a step's time its all-reduces take on the target, over one
        prefill of 1 to 8,192 tokens (0 without tensor parallelism). For a given number of
        tokens that is the step with the least beside its all-reduces: one request (one LM
        head row) and the least attention; decodes and longer contexts add to the rest."""
        if not self.num_allreduces:
            return 0.0
        shares = []
        for k in range(14):
            parts = self.step_time_breakdown(BatchShape.prefill(2**k))
            shares.append(parts["allreduce"] / sum(parts.values()))
        return max(shares)

    def other_ratio(self, num_tokens: int, num_reqs: int) -> float:
        """Target over source time of a step's listed non-attention kernels."""
        src, tgt = self._inventory(num_tokens, num_reqs)
        return tgt / src

    def other_on_target(self, measured_s: float, num_tokens: int, num_reqs: int) -> float:
        """A step's `other`, measured on the source, on the target: the part its kernels'
        rooflines explain by their ratio, the rest (`unlisted_s`) as measured."""
        return carried_by_roofline(measured_s, *self._inventory(num_tokens, num_reqs))

    def attention_on_target(self, measured_s: float, batch: BatchShape) -> float:
        """A step's attention, measured on the source, on the target: the part the analytical
        attention roofline (K/V reads, FLOPs) explains by its ratio, the rest as measured."""
        keys = ("attention", "paged_blocks")
        src = sum(self._src_analytical.step_time_breakdown(batch)[k] for k in keys)
        tgt = sum(self._tgt_analytical.step_time_breakdown(batch)[k] for k in keys)
        return carried_by_roofline(measured_s, src, tgt)

    def unlisted_s(self, num_tokens: int) -> float:
        """What a prefill step of `num_tokens` measured in `other` beyond its kernels'
        rooflines and latencies on the source (0 where they explain it all)."""
        measured = self.source.step_time_breakdown(BatchShape.prefill(num_tokens))["other"]
        return max(measured - self._inventory(num_tokens, 1)[0], 0.0)

    def _inventory(self, num_tokens: int, num_reqs: int) -> tuple[float, float]:
        """(source, target) seconds of the step's kernel inventory, rooflines plus latency."""
        key = (num_tokens, num_reqs)
        times = self._inventory_s.get(key)
        if times is None:
            ops = step_operations(self.widths, num_tokens, num_reqs)
            times = self._inventory_s[key] = (
                total_time(ops, self.source_rates, self.latency_s),
                total_time(ops, self.target_rates, self.latency_s),
            )
        return times

    def kernel_times(self, num_tokens: int, num_reqs: int) -> dict[str, tuple[float, float]]:
        """Kernel name -> (seconds on the source, on the target) of one run of it, as the
        transfer prices it: the part of the source's measured `other` its kernels explain,
        shared among them in proportion to their times by the roofline plus latency, each
        scaled by its own ratio (the unlisted rest is no kernel's: `unlisted_s`)."""
        ops = step_operations(self.widths, num_tokens, num_reqs)
        shape = BatchShape.prefill(num_tokens)
        measured = self.source.step_time_breakdown(shape)["other"]
        scale = min(measured / self._inventory(num_tokens, num_reqs)[0], 1.0)
        return {
            op.name: (
                scale * kernel_time(op, self.source_rates, self.latency_s),
                scale * kernel_time(op, self.target_rates, self.latency_s),
            )
            for op in ops
        }


def carried_by_roofline(measured_s: float, roofline_src_s: float, roofline_tgt_s: float) -> float:
    """`measured_s` on the source, on the target: the part the source's roofline explains (at
    most all of it) moves by the ratio of the two rooflines, the rest stays as measured."""
    if roofline_src_s <= 0.0:
        return measured_s
    explained = min(measured_s, roofline_src_s)
    return explained * roofline_tgt_s / roofline_src_s + (measured_s - explained)


def transfer_source_dir(root: Path, model: str, tensor_parallel_size: int) -> Path | None:
    """The source GPU's profile of `model` at this TP under `root`, if one exists."""
    from pagesim.cost.profile import profile_dir

    path = profile_dir(root, SOURCE_GPU, model, tensor_parallel_size)
    return path if (path / "profile.json").is_file() else None
