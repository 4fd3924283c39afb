"""What the attention kernels' launch parameters depend on in a GPU: its compute capability.

The tiles of `pagesim.gpu.kernels.configs` were chosen on an H200 (sm_90: 228 KiB of shared
memory per SM). An A100 (sm_80) has 164 KiB, an L40S, L4 or A10G (sm_89, sm_86) 100 KiB, and
a tile whose software pipeline needs more shared memory than one program may have does not
compile there; fewer programs fit on an SM at once, which the decode split counts with.
Figures from the CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability" (shared memory per SM and per block, 64 Ki 32-bit registers per SM on all four).
"""

from __future__ import annotations

from typing import NamedTuple

from pagesim.errors import ConfigError

KiB = 1024


class Arch(NamedTuple):
    """The resources of one SM that bound a kernel's tile and how many programs share it."""

    name: str  # "sm80", "sm89", "sm90"
    shared_per_sm_bytes: int
    shared_per_block_bytes: int  # the most one program may use (opt-in)
    registers_per_sm: int
    max_programs_per_sm: int  # resident thread blocks per SM


SM80 = Arch("sm80", 164 * KiB, 163 * KiB, 65536, 32)  # A100
SM86 = Arch("sm86", 100 * KiB, 99 * KiB, 65536, 16)  # A10G, A40, RTX 30
SM89 = Arch("sm89", 100 * KiB, 99 * KiB, 65536, 24)  # L40S, L4, RTX 40
SM90 = Arch("sm90", 228 * KiB, 227 * KiB, 65536, 32)  # H100, H200

#: compute capability "major.minor" -> its SM. Module constant, never mutated at run time.
ARCHS: dict[str, Arch] = {"8.0": SM80, "8.6": SM86, "8.9": SM89, "9.0": SM90}


def arch_of(compute_capability: str) -> Arch:
    """The SM of a compute capability ("8.0", as `torch.cuda.get_device_capability` gives
    it joined by a dot). One not in `ARCHS` gets the newest known one at or below it (a
    newer GPU has at least its resources); below 8.0 (no bf16 tensor cores), one line."""
    try:
        key = tuple(int(x) for x in compute_capability.split("."))
    except ValueError:
        key = ()
    known = [a for c, a in ARCHS.items() if tuple(int(x) for x in c.split(".")) <= key]
    if len(key) != 2 or not known:
        raise ConfigError(
            f"compute capability {compute_capability!r}: the attention kernels need 8.0 or "
            f"newer (launch parameters for {', '.join(ARCHS)})"
        )
    return known[-1]


def device_arch(device) -> Arch:
    """The SM of a torch `device`; sm_90 off CUDA (the CPU interpreter ignores resources)."""
    if getattr(device, "type", "cpu") != "cuda":
        return SM90
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return arch_of(f"{major}.{minor}")


def shared_bytes(block_m: int, tile_n: int, head_size: int, num_stages: int) -> int:
    """Shared memory of one prefill program, fp16/bf16, as a bound: its query tile, and a K
    and a V tile per pipeline stage. The compiler keeps less (the decode kernel's 16 x 64
    tiles of 3 stages count 104 KiB here and were reported at 39 KiB on sm_90), so a tile
    within the bound compiles; one above it may still, but is not chosen."""
    return 2 * (block_m * head_size + num_stages * 2 * tile_n * head_size)


#: Shared memory of one decode program at head size 128, fp16/bf16, 64-token tiles, 3 stages:
#: the sm_90 compiler report (124 registers x 128 threads, 39 KiB). Other head sizes are taken
#: in proportion (the K/V tiles are): an assumption, not a compiler report.
DECODE_SHARED_BYTES_HEAD_128 = 39 * KiB


def decode_programs_per_sm(head_size: int, measured_sm90: int, arch: Arch) -> int:
    """Decode programs resident on one SM of `arch`: the sm_90 count (from its compiler
    report), less where the SM's shared memory holds fewer."""
    per_program = DECODE_SHARED_BYTES_HEAD_128 * head_size // 128
    return max(1, min(measured_sm90, arch.shared_per_sm_bytes // per_program))
