"""Behaviour snapshot: many varied simulations written to a folder, to compare two code versions.

    python benchmarks/behaviour_snapshot.py write DIR [--only NAME,...]
    python benchmarks/behaviour_snapshot.py compare DIR_A DIR_B

`write` runs every case below through the public API (`simulate`, `result_json`,
`write_parquet`) and writes `<case>.json`, `<case>.requests.parquet` and `<case>.steps.parquet`
per case, plus `cases.csv` (case, wall seconds). The JSON's `date` is fixed, so two versions
that behave the same write the same bytes. The cases cover every allocator and placement, swap
and recompute preemption (under a small KV pool so that preemption happens), prefix caching on
and off, fcfs and priority, tensor parallelism, multi-turn sessions and a concurrency cap,
traces, several block sizes, the analytical and calibrated cost models, vLLM 0.23 semantics,
fp8 KV, and each case that has a per-request reference with `bulk_decodes=False` as well.

`compare` prints one line per file that differs or is missing on one side (with the first
differing byte offset) and a summary line; it exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.sim.build import default_profile
from pagesim.sim.output import result_json, write_parquet
from pagesim.sim.simulate import LoadSpec, result_metadata, simulate

FIXED_DATE = "20000101-000000"
INF = float("inf")

# name: (engine overrides, load overrides, use the shipped calibration profile)
Case = tuple[dict[str, Any], dict[str, Any], bool]
SMALL_POOL = {"num_gpu_blocks_override": 600}

CASES: dict[str, Case] = {
    "chat-default": ({}, {"num_prompts": 400, "request_rate": 20.0}, True),
    "chat-analytical": ({}, {"num_prompts": 400, "request_rate": 20.0}, False),
    "chat-burst-inf": ({}, {"num_prompts": 300, "request_rate": INF}, True),
    "chat-bs8": ({"block_size": 8}, {"num_prompts": 300, "request_rate": 20.0}, True),
    "chat-bs32": ({"block_size": 32}, {"num_prompts": 300, "request_rate": 20.0}, True),
    "chat-bs128": ({"block_size": 128}, {"num_prompts": 300, "request_rate": 20.0}, False),
    "chat-no-prefix": (
        {"enable_prefix_caching": False},
        {"num_prompts": 300, "request_rate": 20.0},
        True,
    ),
    "recompute-small": (SMALL_POOL, {"num_prompts": 300, "request_rate": INF}, True),
    "swap-small": (
        {**SMALL_POOL, "preemption_mode": "swap", "swap_space": 1.0},
        {"num_prompts": 300, "request_rate": INF},
        True,
    ),
    "swap-small-priority": (
        {**SMALL_POOL, "preemption_mode": "swap", "scheduling_policy": "priority"},
        {"num_prompts": 300, "request_rate": INF},
        False,
    ),
    "priority-small": (
        {**SMALL_POOL, "scheduling_policy": "priority"},
        {"num_prompts": 300, "request_rate": INF},
        True,
    ),
    "recompute-no-prefix": (
        {**SMALL_POOL, "enable_prefix_caching": False},
        {"num_prompts": 300, "request_rate": INF},
        False,
    ),
    "reserve-max-buddy": (
        {"allocator": "reserve-max", "max_model_len": 4096},
        {"num_prompts": 300, "request_rate": 30.0},
        True,
    ),
    "reserve-max-firstfit": (
        {"allocator": "reserve-max", "contiguous_placement": "first-fit"},
        {"num_prompts": 300, "request_rate": 30.0},
        False,
    ),
    "pow2-buddy": ({"allocator": "pow2"}, {"num_prompts": 300, "request_rate": 30.0}, True),
    "pow2-firstfit-small": (
        {"allocator": "pow2", "contiguous_placement": "first-fit", **SMALL_POOL},
        {"num_prompts": 200, "request_rate": INF},
        False,
    ),
    "oracle-buddy": ({"allocator": "oracle"}, {"num_prompts": 300, "request_rate": 30.0}, True),
    "oracle-swap-small": (
        {"allocator": "oracle", "preemption_mode": "swap", **SMALL_POOL},
        {"num_prompts": 200, "request_rate": INF},
        False,
    ),
    "tp2-70b": (
        {"model": "llama-2-70b", "tensor_parallel_size": 2},
        {"num_prompts": 200, "request_rate": 5.0},
        False,
    ),
    "tp2-8b-small": (
        {"model": "llama-3-8b", "tensor_parallel_size": 2, **SMALL_POOL},
        {"num_prompts": 200, "request_rate": INF},
        False,
    ),
    "multi-turn": ({}, {"workload": "multi-turn", "num_prompts": 300}, True),
    "multi-turn-conc": (
        {},
        {"workload": "multi-turn", "num_prompts": 300, "max_concurrency": 16},
        True,
    ),
    "multi-turn-small": (SMALL_POOL, {"workload": "multi-turn", "num_prompts": 200}, False),
    "conversation": ({}, {"workload": "conversation", "num_prompts": 300}, True),
    "system-prompt": ({}, {"workload": "system-prompt", "num_prompts": 300}, True),
    "system-prompt-small": (
        {**SMALL_POOL, "block_size": 32},
        {"workload": "system-prompt", "num_prompts": 300, "request_rate": INF},
        True,
    ),
    "code-rate": ({}, {"workload": "code", "num_prompts": 200, "request_rate": 8.0}, True),
    "mooncake": ({}, {"workload": "mooncake-conversation", "num_prompts": 200}, True),
    "mooncake-synthetic": ({}, {"workload": "mooncake-synthetic", "num_prompts": 200}, False),
    "mix-burstiness": (
        {},
        {"workload": "mix", "num_prompts": 300, "request_rate": 15.0, "burstiness": 0.5},
        True,
    ),
    "random-len": (
        {},
        {
            "workload": "random",
            "num_prompts": 200,
            "request_rate": 20.0,
            "random_input_len": 900,
            "random_output_len": 120,
            "random_range_ratio": 0.5,
            "random_prefix_len": 64,
        },
        False,
    ),
    "no-chunked": (
        {"enable_chunked_prefill": False},
        {"num_prompts": 300, "request_rate": 20.0},
        True,
    ),
    "long-prefill-threshold": (
        {"long_prefill_token_threshold": 256, "max_num_batched_tokens": 1024, "max_num_seqs": 32},
        {"num_prompts": 300, "request_rate": INF},
        True,
    ),
    "vllm-023": ({"vllm_compat": "0.23", **SMALL_POOL}, {"num_prompts": 300}, True),
    "fp8-kv": ({"kv_cache_dtype": "fp8"}, {"num_prompts": 300, "request_rate": 20.0}, False),
    "a100-13b": (
        {"model": "llama-2-13b", "gpu": "a100-80gb", "gpu_memory_utilization": 0.8},
        {"num_prompts": 200, "request_rate": 4.0},
        False,
    ),
    "mistral-sliding-window": (
        {"model": "mistral-7b", **SMALL_POOL},
        {"num_prompts": 200, "request_rate": INF},
        False,
    ),
    "mistral-sliding-window-pow2": (
        {"model": "mistral-7b", "allocator": "pow2"},
        {"num_prompts": 200, "request_rate": 10.0},
        False,
    ),
    "goodput-percentiles": (
        {},
        {
            "num_prompts": 300,
            "request_rate": 20.0,
            "percentiles": (50, 90, 99),
            "goodput_slos_ms": (("ttft", 500.0), ("tpot", 50.0)),
        },
        True,
    ),
}
# Cases run again through the per-request path, whose results must equal those with bulk decodes.
SLOW_TWINS = ("chat-default", "recompute-small", "swap-small", "multi-turn", "system-prompt")


def all_cases() -> dict[str, tuple[dict[str, Any], dict[str, Any], bool, bool]]:
    cases = {name: (e, ld, prof, True) for name, (e, ld, prof) in CASES.items()}
    for name in SLOW_TWINS:
        e, ld, prof = CASES[name]
        cases[f"{name}-per-request"] = (e, ld, prof, False)
    return cases


def write_case(directory: Path, name: str, engine: dict, load: dict, prof: bool, fast: bool):
    config = EngineConfig.create(**engine)
    spec = LoadSpec(**load)
    profile = default_profile(config) if prof else None
    sim = simulate(config, spec, profile=profile, bulk_decodes=fast)
    metadata = result_metadata(config, spec)
    metadata["cost_model"] = "calibrated" if profile else "analytical"
    (directory / f"{name}.json").write_text(result_json(sim.result, metadata, date=FIXED_DATE))
    write_parquet(sim.metrics, directory, name)


def write(directory: Path, only: set[str] | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, (engine, load, prof, fast) in all_cases().items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        write_case(directory, name, engine, load, prof, fast)
        wall = time.perf_counter() - t0
        rows.append({"case": name, "wall_s": f"{wall:.3f}"})
        print(f"{name:<32} {wall:7.2f} s", flush=True)
    with (directory / "cases.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["case", "wall_s"])
        w.writeheader()
        w.writerows(rows)


def compare(a: Path, b: Path) -> int:
    names = sorted(({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}) - {"cases.csv"})
    differ = 0
    for n in names:
        pa, pb = a / n, b / n
        if not pa.exists() or not pb.exists():
            print(f"{n}: only in {a if pa.exists() else b}")
            differ += 1
            continue
        da, db = pa.read_bytes(), pb.read_bytes()
        if da != db:
            first = next(
                (i for i, (x, y) in enumerate(zip(da, db, strict=False)) if x != y),
                min(len(da), len(db)),
            )
            print(f"{n}: differs (sizes {len(da)} / {len(db)}, first difference at byte {first})")
            differ += 1
    print(f"{len(names)} files compared, {differ} differ")
    return 1 if differ else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir", type=Path)
    w.add_argument("--only", default="", help="comma-separated case names")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "write":
        write(args.dir, set(filter(None, args.only.split(","))) or None)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()
