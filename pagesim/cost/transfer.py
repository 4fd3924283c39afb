"""The transfer cost model: a profile measured on one GPU, carried to another part by part.

The calibrated model of the source GPU (`CalibratedCostModel`) prices a step and splits it into
its measured parts; each part is scaled by the ratio, target over source, of the time the
rate that bounds it gives:

    other       GEMMs, norms, element-wise kernels, LM head: the ratio of the two GPUs'
                kernel-by-kernel rooflines (`pagesim.cost.operations`) at the step's tokens,
                each kernel memory- or compute-bound by its arithmetic intensity against each
                GPU's ridge point, plus a fixed latency per kernel. What the measured `other`
                holds beyond the kernels' rooflines (at large steps, device work the inventory
                does not list: unfused element-wise passes) moves with the memory bandwidth
    attention   the analytical model's attention (paged decode reads, prefill FLOPs, each
                entry in its own regime) on the target over the same on the source
    allreduce   the analytical all-reduce on the target over the same on the source (its
                latency stays, its bytes move at the bus bandwidth NCCL reaches on the
                target's link: a published figure where known, else the datasheet link rate
                times the source's share)
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

from pagesim.cost.analytical import AnalyticalConstants, AnalyticalCostModel
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
            out["attention"] = src["attention"] * self._ratio(batch, ("attention", "paged_blocks"))
            out["allreduce"] = src["allreduce"] * self._ratio(batch, ("allreduce",))
            out["host_overhead"] = src["host_overhead"]
        if moves:
            mine = self._swap_copy.step_time_breakdown(batch)
            out["swap"], out["copy"] = mine["swap"], mine["copy"]
        return out

    def other_ratio(self, num_tokens: int, num_reqs: int) -> float:
        """Target over source time of a step's listed non-attention kernels."""
        src, tgt = self._inventory(num_tokens, num_reqs)
        return tgt / src

    def other_on_target(self, measured_s: float, num_tokens: int, num_reqs: int) -> float:
        """A step's `other`, measured on the source, on the target: the part its kernels'
        rooflines explain by their ratio, the rest (`unlisted_s`) by the memory bandwidth's."""
        src, tgt = self._inventory(num_tokens, num_reqs)
        listed = min(measured_s, src)
        bandwidth = self.source_rates.memory_bytes_per_s / self.target_rates.memory_bytes_per_s
        return listed * tgt / src + (measured_s - listed) * bandwidth

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

    # ---- the model ----
    def _ratio(self, batch: BatchShape, keys: tuple[str, ...]) -> float:
        src = self._src_analytical.step_time_breakdown(batch)
        den = sum(src[k] for k in keys)
        if den <= 0.0:
            return 1.0
        tgt = self._tgt_analytical.step_time_breakdown(batch)
        return sum(tgt[k] for k in keys) / den


def transfer_source_dir(root: Path, model: str, tensor_parallel_size: int) -> Path | None:
    """The source GPU's profile of `model` at this TP under `root`, if one exists."""
    from pagesim.cost.profile import profile_dir

    path = profile_dir(root, SOURCE_GPU, model, tensor_parallel_size)
    return path if (path / "profile.json").is_file() else None
