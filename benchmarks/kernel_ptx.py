"""The PTX of the attention kernels, compiled for a GPU target on any machine (no GPU needed).

    python benchmarks/kernel_ptx.py [--arch 90] [--out results/kernel_ptx.csv]

Compiles the decode and prefill kernels (fp16, the llama-3-8b head shape, block sizes 16 and
64, with and without a sliding window) through Triton's own compiler for the given compute
capability, without line information, and prints a SHA-256 of each PTX. A refactor of a
kernel's source that leaves every hash unchanged leaves the GPU code unchanged, so it needs
no timing on a GPU; a changed hash needs one (`benchmarks/attention.py`).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import inspect
import os
from pathlib import Path

os.environ.setdefault("TRITON_DISABLE_LINE_INFO", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from pagesim.gpu.kernels.paged_attention import _paged_decode_kernel  # noqa: E402
from pagesim.gpu.kernels.prefill_attention import _paged_prefill_kernel  # noqa: E402

INDEX_POINTERS = ("block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr")
FP32_POINTERS = ("part_out_ptr", "part_max_ptr", "part_sum_ptr")


def signature(kernel, constexprs: dict) -> tuple[dict, dict]:
    """Triton's (signature, constexprs) for `kernel` with fp16 tensors and int32 indices."""
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {}
    for name in names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INDEX_POINTERS:
            sig[name] = "*i32"
        elif name in FP32_POINTERS:
            sig[name] = "*fp32"
        elif name.endswith("_ptr"):
            sig[name] = "*fp16"
        elif name.startswith("stride"):
            sig[name] = "i64"
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
    return sig, {(names.index(k),): v for k, v in constexprs.items()}


def ptx_hash(kernel, constexprs: dict, arch: int) -> tuple[str, int]:
    sig, consts = signature(kernel, constexprs)
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options={"num_warps": 4, "num_stages": 2}
    )
    ptx = compiled.asm["ptx"]
    return hashlib.sha256(ptx.encode()).hexdigest()[:16], len(ptx)


def variants() -> list[tuple[str, object, dict]]:
    common = {"QUERIES_PER_KV": 4, "HEAD_SIZE": 128, "TILE_N": 32, "DOT_PRECISION": "tf32"}
    out = []
    for block_size in (16, 64):
        for window in (False, True):
            shape = {**common, "BLOCK_SIZE": block_size, "USE_WINDOW": window}
            tag = f"bs{block_size}{'-window' if window else ''}"
            for split in (False, True):
                decode = {**shape, "BLOCK_M": 16, "SPLIT": split}
                out.append(
                    (f"decode-{tag}{'-split' if split else ''}", _paged_decode_kernel, decode)
                )
            prefill = {**shape, "BLOCK_Q": 16, "BLOCK_M": 64}
            out.append((f"prefill-{tag}", _paged_prefill_kernel, prefill))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 89, 90")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as CSV")
    args = ap.parse_args()
    rows = []
    print(f"triton {triton.__version__}, sm{args.arch}")
    print(f"{'kernel':28} {'ptx sha256':16} {'bytes':>8}")
    for name, kernel, constexprs in variants():
        digest, size = ptx_hash(kernel, constexprs, args.arch)
        rows.append({"kernel": name, "arch": args.arch, "ptx_sha256": digest, "ptx_bytes": size})
        print(f"{name:28} {digest:16} {size:8d}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
