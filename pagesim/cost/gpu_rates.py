"""The rates that bound a step's parts on each GPU, for carrying a profile between GPUs.

A measured profile of one GPU is carried to another (`pagesim.cost.transfer`) by the ratio of
the rate that bounds each part of the step on the two GPUs. Those rates are the GPU's
*achievable* rates, not its datasheet peaks: memory-bound kernels are judged against the
card's measured copy bandwidth (DESIGN.md section 6), compute-bound GEMMs against the dense
tensor rate a large cuBLAS GEMM reaches. Where a card's achievable rate was measured, it is
used; where not, the datasheet rate times the share that the analytical model assumes
(`AnalyticalConstants`), the same share on every card, so that a ratio of two unmeasured
cards is the ratio of their datasheets. Datasheet rates are `GPUSpec`'s (`pagesim.specs`,
each with its source); the measured rates below carry theirs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.cost.analytical import AnalyticalConstants
from pagesim.specs import GPUSpec


@dataclass(frozen=True)
class MeasuredRates:
    """What was measured on one GPU, each with where it comes from."""

    copy_bytes_per_s: float | None = None  # bytes read + written per second by a large copy
    copy_source: str = ""
    gemm_flops: float | None = None  # dense fp16/bf16 FLOP/s of a large GEMM
    gemm_source: str = ""


#: GPU name -> rates measured on it. Module constant, never mutated at run time.
MEASURED: dict[str, MeasuredRates] = {
    # H200: a device-to-device copy of 1 GiB reaches about 4.3 TB/s counted as bytes read plus
    # written (pagesim's own measurement, DESIGN.md section 6); bf16 cuBLAS GEMMs of the
    # llama-2-7b and llama-3-8b layers at 2,048 and 4,096 tokens reach 736 TFLOP/s (median of
    # 16, `benchmarks/gemm_rate.py`, docs/other_gpus.md).
    "h200": MeasuredRates(
        copy_bytes_per_s=4.3e12,
        copy_source="measured: 1 GiB device copy, read + write, pagesim on H200 (DESIGN.md 6)",
        gemm_flops=736e12,
        gemm_source="measured: bf16 cuBLAS layer GEMMs at 2-4k tokens, pagesim on H200",
    ),
}

#: The GPU whose measured GEMM share (of its datasheet rate) stands in for cards with none.
GEMM_SHARE_GPU = "h200"


@dataclass(frozen=True)
class BoundingRates:
    """The two rates of one GPU's roofline, as the transfer uses them, and their sources."""

    gpu: str
    memory_bytes_per_s: float
    memory_source: str
    gemm_flops: float
    gemm_source: str

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity above which a kernel is compute-bound on this GPU."""
        return self.gemm_flops / self.memory_bytes_per_s

    @classmethod
    def of(cls, gpu: GPUSpec, constants: AnalyticalConstants | None = None) -> BoundingRates:
        """The GPU's measured rates where `MEASURED` has them, else datasheet x assumed share."""
        c = constants or AnalyticalConstants()
        m = MEASURED.get(gpu.name, MeasuredRates())
        if m.copy_bytes_per_s is not None:
            mem, mem_src = m.copy_bytes_per_s, m.copy_source
        else:
            mem = gpu.hbm_bandwidth_bytes_per_s * c.weight_bandwidth_efficiency
            mem_src = f"datasheet x {c.weight_bandwidth_efficiency:g} (assumed share)"
        if m.gemm_flops is not None:
            gemm, gemm_src = m.gemm_flops, m.gemm_source
        else:
            share = measured_gemm_share()
            gemm = gpu.fp16_flops * share
            gemm_src = f"datasheet x {share:.3g} (the {GEMM_SHARE_GPU}'s measured share)"
        return cls(gpu.name, mem, mem_src, gemm, gemm_src)


def measured_gemm_share() -> float:
    """The share of its datasheet tensor rate that a large cuBLAS GEMM reached on the measured
    card: a card without a measured rate is assumed to reach the same share of its own. Not
    the analytical model's `gemm_flops_efficiency`, which also absorbs what a step spends
    beside its GEMMs."""
    rate = MEASURED[GEMM_SHARE_GPU].gemm_flops
    assert rate is not None  # module data: the stand-in card has a measured rate
    return rate / GPUSpec.from_name(GEMM_SHARE_GPU).fp16_flops
