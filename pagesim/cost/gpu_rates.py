"""The rates that bound a step's parts on each GPU, for carrying a profile between GPUs.

A measured profile of one GPU is carried to another (`pagesim.cost.transfer`) by the ratio of
the rate that bounds each part of the step on the two GPUs. Those rates are the GPU's
*achievable* rates, not its datasheet peaks: memory-bound kernels are judged against the
card's measured copy bandwidth (DESIGN.md section 6), compute-bound GEMMs against the dense
tensor rate a large cuBLAS GEMM reaches, all-reduces against the bus bandwidth NCCL's ring
all-reduce reaches on the card's link. Where a card's achievable rate was measured, it is
used; where not, the datasheet rate times one share, the same on every card, so that a ratio
of two unmeasured cards is the ratio of their datasheets: the analytical model's share
(`AnalyticalConstants`) for memory, the measured share of the reference card for the tensor
rate and the link. Datasheet rates are `GPUSpec`'s (`pagesim.specs`, each with its source);
the measured rates below carry theirs.
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
    # NCCL ring all-reduce bus bandwidth (bytes / time * 2 (n - 1) / n) of a large message
    # between GPUs of one node, over the link the card's GPUSpec names
    allreduce_busbw_bytes_per_s: float | None = None
    allreduce_source: str = ""


# The all-reduce bus bandwidths are published figures of large-message NCCL ring
# all-reduces, not pagesim's measurements, and not read from Vidur's tables (the check).
# docs/other_gpus.md gives them with their sources and why NVLink 3 and 4 reach different
# shares of their line rates (an A100 moves an all-reduce's bytes 1.61 times slower than the
# H200, not the datasheets' 1.5).
_NVLINK4_BUSBW = 370e9
_NVLINK4_SOURCE = (
    "published: NCCL ring all-reduce busbw on NVLink 4, ~370 GB/s "
    "(https://github.com/NVIDIA/nccl-tests/issues/212, https://github.com/NVIDIA/nccl/issues/1455)"
)
_NVLINK3 = MeasuredRates(
    allreduce_busbw_bytes_per_s=230e9,
    allreduce_source="published: NCCL all-reduce busbw on A100 NVLink 3, ~230 GB/s "
    "(https://github.com/NVIDIA/nccl-tests/issues/149)",
)

#: GPU name -> rates measured on it. Module constant, never mutated at run time.
MEASURED: dict[str, MeasuredRates] = {
    # How each card's rates were measured, and where the results are: docs/other_gpus.md.
    "h200": MeasuredRates(
        copy_bytes_per_s=4.3e12,
        copy_source="measured: 1 GiB device copy, read + write, pagesim on H200 (DESIGN.md 6)",
        gemm_flops=736e12,
        gemm_source="measured: bf16 cuBLAS layer GEMMs at 2-4k tokens, pagesim on H200",
        allreduce_busbw_bytes_per_s=_NVLINK4_BUSBW,
        allreduce_source=_NVLINK4_SOURCE,
    ),
    "h100-sxm": MeasuredRates(
        copy_bytes_per_s=3.02e12,
        copy_source="measured: 4 GiB device copy, read + write, pagesim on H100 SXM",
        gemm_flops=734.5e12,
        gemm_source="measured: bf16 cuBLAS llama-3-8b layer GEMMs at 2-4k tokens, pagesim on H100",
        allreduce_busbw_bytes_per_s=_NVLINK4_BUSBW,
        allreduce_source=_NVLINK4_SOURCE,
    ),
    "a100-80gb": _NVLINK3,
    "a100-40gb": _NVLINK3,
}

#: The GPU whose measured GEMM and all-reduce shares (of its datasheet rates) stand in for
#: cards with none.
GEMM_SHARE_GPU = "h200"
LINK_SHARE_GPU = "h200"


@dataclass(frozen=True)
class BoundingRates:
    """The two rates of one GPU's roofline, as the transfer uses them, and their sources."""

    gpu: str
    memory_bytes_per_s: float
    memory_source: str
    gemm_flops: float
    gemm_source: str
    link_bytes_per_s: float  # all-reduce bus bandwidth over the card's link (NVLink or PCIe)
    link_source: str

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
        if m.allreduce_busbw_bytes_per_s is not None:
            link, link_src = m.allreduce_busbw_bytes_per_s, m.allreduce_source
        else:
            share = measured_link_share()
            link = link_bytes_per_s(gpu) * share
            link_src = f"datasheet x {share:.3g} (the {LINK_SHARE_GPU}'s published share)"
        return cls(gpu.name, mem, mem_src, gemm, gemm_src, link, link_src)


def measured_gemm_share() -> float:
    """The share of its datasheet tensor rate that a large cuBLAS GEMM reached on the measured
    card: a card without a measured rate is assumed to reach the same share of its own. Not
    the analytical model's `gemm_flops_efficiency`, which also absorbs what a step spends
    beside its GEMMs."""
    rate = MEASURED[GEMM_SHARE_GPU].gemm_flops
    assert rate is not None  # module data: the stand-in card has a measured rate
    return rate / GPUSpec.from_name(GEMM_SHARE_GPU).fp16_flops


def link_bytes_per_s(gpu: GPUSpec) -> float:
    """The datasheet rate, one direction, of the link the GPU's all-reduces cross: NVLink where
    it has one, else its host link (PCIe), as the analytical all-reduce term takes it."""
    return gpu.nvlink_bytes_per_s or gpu.host_link_bytes_per_s


def measured_link_share() -> float:
    """The share of its link's datasheet rate that a large NCCL all-reduce reaches on the
    reference card: a card without a published figure is assumed to reach the same share."""
    rate = MEASURED[LINK_SHARE_GPU].allreduce_busbw_bytes_per_s
    assert rate is not None  # module data: the stand-in card has a figure
    return rate / link_bytes_per_s(GPUSpec.from_name(LINK_SHARE_GPU))
