"""The one script run on the GPU machine: checks, calibration and the real validation runs.

    PYTHONPATH=. python3 benchmarks/gpu_session.py --models llama-2-7b --budget-s 420

Per model: (1) a correctness check of the random-weight model on the GPU (paged attention
against a dense fp32 forward), (2) `run_calibration` (the profile), (2b) decode steps timed
with CUDA graphs and eagerly in the same runner (`graph_vs_eager.json`; skipped with
`--enforce-eager`), (3) real runs through
`Scheduler` + `GPUModelRunner` in wall-clock time: chat at rate inf (its throughput is the
measured capacity), chat at 50/85/95 % of it, code and system-prompt (prefix caching on), and
block size 32, in that order of priority, each skipped when the time budget cannot hold it.
The simulator half of the validation runs later on a CPU (`pagesim validate --real ...`).

Plans for a frozen out-of-sample round, each one call of at most 10 minutes:

    # call A: calibrate both models on the full block-size grid (8-128, every table), no runs
    PYTHONPATH=. python3 benchmarks/gpu_session.py --plan calibrate \
        --models llama-2-7b,llama-3-8b --budget-s 570 --calib-budget-s 255
    # call B: no calibration (the model and its KV capacity only); llama-2-7b serves chat at
    # 85 % of capacity on blocks 8-128, bursty chat, multi-turn, bwb and a conversation
    # trace, each twice (the second pass after the first)
    PYTHONPATH=. python3 benchmarks/gpu_session.py --plan serve --models llama-2-7b \
        --budget-s 580

MoE and hybrid attention (`--plan moe-hybrid`, one call per model): a check of the paged
forward against dense fp32 (first two layers; the MoE one in fp32, the hybrid one with a
sliding and a full layer over their own KV cache groups), calibration at block 16 only (every
table, `--calib-budget-s`), then chat at rate inf (capacity) and at 85 % of it, each twice, the
second pass after the first, laid out as the other plans lay them out:

    PYTHONPATH=. python3 benchmarks/gpu_session.py --plan moe-hybrid --models qwen3-30b-a3b \
        --budget-s 570 --calib-budget-s 150
    PYTHONPATH=. python3 benchmarks/gpu_session.py --plan moe-hybrid --models gemma-2-9b \
        --budget-s 570 --calib-budget-s 150

H200 wall time per call, 5.1-5.4 minutes measured (2026-12-02): weights, the check and the
first compiles 0.3 min, the grid 1.5 min plus the host-overhead replay 0.4-0.5 min, four runs
3.1-3.3 min (qwen3-30b-a3b captures its CUDA graphs before each run, about 0.5 min). gemma-2-9b
serves through the hybrid KV cache manager under CUDA graphs too (one block table per KV cache
group): 3.7 minutes for the whole call (2026-12-02). The budget check skips a run that no longer fits. The fused-MoE kernel at
qwen3-30b-a3b's shapes, bf16, one layer, graph replay on the H200: 0.09 ms at 1 token,
0.42 ms at 256 (every expert read: 1.2 GB at 2.9 TB/s), 2.0 ms at 8,192; 2.9e-3 relative
error against dense fp32, graph replay equal to eager (torch 2.11, triton 3.6, 2026-12-02).

Everything goes under `--out` (default `$OUT`): a work tree packed into `session.tar.gz`
after every phase (so a run stopped at its limit still returns what it finished), the log,
and `summary.json`. `--dry-run-cpu` runs the same flow on the tiny model under the Triton
interpreter, with a small grid and small stand-ins of the plan's loads (same names, block
sizes, arrival kinds and multi-turn sessions; tiny lengths), to test this script without a
GPU.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import math
import os
import sys
import tarfile
import time
import traceback
from pathlib import Path

T0 = time.monotonic()
#: Seconds of the session's budget kept back from the calibration grid: for the served runs,
#: or with --calibrate-only for the host-overhead replay and packing that follow the grid.
RUNS_RESERVE_S = 200.0
CALIBRATE_ONLY_RESERVE_S = 40.0


class Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s):
        for st in self.streams:
            st.write(s)
            st.flush()
        return len(s)


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def left(budget: float) -> float:
    return budget - (time.monotonic() - T0)


def pack(out: Path, work: Path) -> None:
    """Pack the work tree into out/session.tar.gz atomically."""
    tmp = out / "session.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(work, arcname="work")
    os.replace(tmp, out / "session.tar.gz")


def check_model(spec_name: str, dtype, device: str) -> float:
    """Relative error of the paged forward (a prefill of two sequences) against dense fp32,
    on the model's first two layers. A hybrid model keeps a sliding and a full layer, each
    reading its KV cache group's table, with the window cut to 64 so that the 100-token
    sequence crosses it. An MoE model is checked in fp32: in bf16 a near-tie of two experts'
    router logits can fall either way in the two forwards, which says nothing of the kernels."""
    import dataclasses

    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.kv_layout import KVLayout
    from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder, reference_attention_forward
    from pagesim.gpu.runner import allocate_kv_cache

    spec = EngineConfig.create(model=spec_name).model_spec
    window = None if spec.sliding_window is None else min(64, spec.sliding_window)
    small = dataclasses.replace(
        spec, num_layers=2, layer_types=spec.layer_types[:2], sliding_window=window
    )
    if small.is_moe:
        dtype = torch.float32
    model = RandomWeightDecoder(DecoderConfig(small, dtype, device, 16, seed=5))
    layout = KVLayout.of(small, hybrid_kv_cache_manager=True)
    kv = allocate_kv_cache(model, 64, device, layout=layout)
    lens = [37, 100]
    rows = [[3, 4, 5], [10, 11, 12, 13, 14, 15, 16]]
    mds = tuple(
        model.group_attn(kind).build_metadata(
            [[b + 20 * g for b in row] for row in rows], [0, 0], lens, device
        )
        for g, kind in enumerate(layout.group_kinds)
    )
    md = mds if layout.is_hybrid else mds[0]
    ids = torch.randint(0, min(1000, small.vocab_size), (sum(lens),), device=device)
    pos = torch.cat([torch.arange(n, device=device) for n in lens])
    li = (mds[0].query_start_loc[1:] - 1).long()
    out = model.forward(ids, pos, md, kv, li)
    past = [{} for _ in model.layers]
    ref = reference_attention_forward(model, ids, pos, [(0, 37, 0), (37, 137, 1)], past, li)
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    del kv, model
    return err


def graph_vs_eager(
    config,
    model,
    num_gpu_blocks: int,
    dry: bool,
    reps: int = 10,
    shapes: dict | None = None,
    modes: tuple[str, ...] = ("graph", "eager"),
) -> list[dict]:
    """Steps timed on the host clock with graph replay and eagerly in one runner, alternating,
    and the relative difference of their final hidden rows (`pagesim.gpu.graph_check`).
    Shapes: decode batches, and mixed steps (a prefill, a chunk with decodes, several
    prefill entries), as lists of (context, new tokens) entries. `modes=("graph",)` times the
    steps as a served run would run them alone (`speed_probe`)."""
    from pagesim.gpu.graph_check import DEFAULT_SHAPES, graph_vs_eager_rows
    from pagesim.gpu.runner import GPUModelRunner, RunnerConfig

    options = RunnerConfig(device=model.device, cuda_graphs="graph" in modes)
    runner = GPUModelRunner(config, num_gpu_blocks, options, model=model)
    graphs = runner.graphs
    if graphs is None and "graph" in modes:
        return []
    if shapes is None:
        shapes = {"decode 1x40": [(40, 1)], "prefill 24": [(0, 24)]} if dry else DEFAULT_SHAPES

    def use_graphs(on: bool) -> None:
        runner.graphs = graphs if on else None

    return graph_vs_eager_rows(runner, use_graphs, shapes, reps=reps, modes=modes, log=log)


def speed_probe(
    config, model, num_gpu_blocks: int, dry: bool, graphs: bool = True
) -> dict[str, float]:
    """Median ms of a few fixed steps, each run as a served run runs it (graphs where the
    runner would replay one), in a fresh runner: timed between served runs, they say how fast
    the GPU and host are at that moment, apart from the runs' own shapes."""
    shapes = (
        {"decode 2x40": [(40, 1)] * 2, "prefill 40": [(0, 40)]}
        if dry
        else {
            "decode 16x2048": [(2048, 1)] * 16,
            "decode 64x1024": [(1024, 1)] * 64,
            "32 decodes x1024 + chunk 256": [(1024, 1)] * 32 + [(0, 256)],
            "prefill 2048": [(0, 2048)],
        }
    )
    model.set_block_size(config.block_size)
    rows = graph_vs_eager(
        config,
        model,
        num_gpu_blocks,
        dry,
        reps=3 if dry else 10,
        shapes=shapes,
        modes=("graph",) if graphs else ("eager",),
    )
    if model.device.type == "cuda":
        import torch

        torch.cuda.empty_cache()
    probe = {r["shape"]: r["ms"] for r in rows}
    log(f"  probe: {', '.join(f'{k} {v:.2f} ms' for k, v in probe.items())}")
    return probe


def run_plan(dry: bool, plan: str = "validate") -> list[dict]:
    """The real runs, in priority order. `rate` is "inf" or a fraction of the capacity
    measured by the run named `of` (default chat-inf-bs16: its request throughput).

    `plan="repeat"`: the runs that missed targets in earlier calls, each served twice in a row
    (the second named `<name>-r2`, same seed, same rate), to measure how far two real runs of
    one workload differ within one call: the floor under any prediction's error.

    `plan="calibrate"`: no runs (call A); `plan="serve"`: `_serve_plan` (call B), in a dry run
    as tiny stand-ins (`dry_stand_in`); `plan="moe-hybrid"`: `_moe_hybrid_plan`, likewise."""
    if plan == "calibrate":
        return []
    if plan == "moe-hybrid":
        runs = _moe_hybrid_plan()
        return [dry_stand_in(spec) for spec in runs] if dry else runs
    if plan == "serve":
        runs = _serve_plan()
        return [dry_stand_in(spec) for spec in runs] if dry else runs
    if dry:
        rnd = {"random_input_len": 24, "random_output_len": 3}
        return [
            {
                "name": "random-inf-bs16",
                "workload": "random",
                "rate": "inf",
                "block_size": 16,
                "num_prompts": 4,
                **rnd,
            },
            {
                "name": "random-r2-bs32",
                "workload": "random",
                "rate": 2.0,
                "burstiness": 0.5,
                "block_size": 32,
                "num_prompts": 3,
                **rnd,
            },
        ]
    if plan == "repeat":
        return _repeat_plan()
    if plan == "drift":
        return _drift_plan()
    if plan == "oos":
        return _out_of_sample_plan()
    return [
        {
            "name": "chat-inf-bs16",
            "workload": "chat",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        },
        {"name": "chat-50pct-bs16", "workload": "chat", "rate": 0.50, "block_size": 16},
        {"name": "chat-85pct-bs16", "workload": "chat", "rate": 0.85, "block_size": 16},
        {"name": "chat-95pct-bs16", "workload": "chat", "rate": 0.95, "block_size": 16},
        {
            "name": "system-prompt-inf-bs16",
            "workload": "system-prompt",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        },
        {
            "name": "code-inf-bs16",
            "workload": "code",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        },
        {"name": "chat-85pct-bs32", "workload": "chat", "rate": 0.85, "block_size": 32},
        {
            "name": "chat-inf-bs32",
            "workload": "chat",
            "rate": "inf",
            "block_size": 32,
            "num_prompts": 150,
        },
        {
            "name": "system-prompt-85pct-bs16",
            "workload": "system-prompt",
            "rate": 0.85,
            "block_size": 16,
            "of": "system-prompt-inf-bs16",
        },
        {
            "name": "code-85pct-bs16",
            "workload": "code",
            "rate": 0.85,
            "block_size": 16,
            "of": "code-inf-bs16",
        },
    ]


def later_passes(plan: list[dict], passes: int, names: set[str] | None = None) -> list[dict]:
    """Passes 2 to `passes` of `plan` (only the runs in `names`, if given), in the plan's
    order, named `<name>-r<pass>`: the same traffic again, at the rates set by the first
    pass's capacity. Spread over the call, they measure how far identical real runs minutes
    apart differ, and give `pagesim validate` a mean to compare with (`repeat_groups`)."""
    return [
        {**spec, "name": f"{spec['name']}-r{k}"}
        for k in range(2, passes + 1)
        for spec in plan
        if names is None or spec["name"] in names
    ]


def _drift_plan() -> list[dict]:
    """chat at 85 % on blocks 16 and 32, three times each, alternating (with `--probe`, the
    fixed steps of `speed_probe` are timed before each run): how far identical runs minutes
    apart move, and whether the GPU's speed moves with them."""
    plan = [
        {
            "name": "chat-inf-bs16",
            "workload": "chat",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        }
    ]
    for i in ("", "-r2", "-r3"):
        for bs in (16, 32):
            plan.append(
                {
                    "name": f"chat-85pct-bs{bs}{i}",
                    "workload": "chat",
                    "rate": 0.85,
                    "block_size": bs,
                }
            )
    return plan


def _out_of_sample_plan() -> list[dict]:
    """Out-of-sample validation: chat at 85 % of capacity on every calibrated block size, then
    chat at 50 and 95 %, bursty chat and system-prompt (prefix sharing, at 85 % of chat's
    capacity), each served twice, the second pass (`-r2`) after the first, so that repeats
    lie minutes apart; then, once each if time is left, a conversation trace replay at its
    own arrivals and long outputs (bwb, at a fraction of its own capacity, bwb-inf-bs16)."""
    inf = {"rate": "inf", "block_size": 16, "num_prompts": 150}
    first = [{"name": "chat-inf-bs16", "workload": "chat", **inf}]
    loads = [
        {"name": f"chat-85pct-bs{bs}", "workload": "chat", "rate": 0.85, "block_size": bs}
        for bs in (16, 64, 8, 32, 128)
    ]
    loads += [
        {"name": "chat-50pct-bs16", "workload": "chat", "rate": 0.50, "block_size": 16},
        {"name": "chat-95pct-bs16", "workload": "chat", "rate": 0.95, "block_size": 16},
        {
            "name": "chat-bursty-85pct-bs16",
            "workload": "chat",
            "rate": 0.85,
            "block_size": 16,
            "burstiness": 0.5,
        },
        {
            "name": "system-prompt-chat85pct-bs16",
            "workload": "system-prompt",
            "rate": 0.85,
            "block_size": 16,
        },
    ]
    extra = [
        {
            "name": "conversation-trace-bs16",
            "workload": "conversation",
            "rate": None,
            "block_size": 16,
            "num_prompts": 60,
        },
        {"name": "bwb-inf-bs16", "workload": "bwb", **inf, "num_prompts": 48},
        {
            "name": "bwb-85pct-bs16",
            "workload": "bwb",
            "rate": 0.85,
            "block_size": 16,
            "of": "bwb-inf-bs16",
            "num_prompts": 40,
        },
    ]
    return first + loads + [{**s, "name": s["name"] + "-r2"} for s in loads] + extra


#: Models of `--plan moe-hybrid` (its default `--models`): a mixture of experts and a model of
#: sliding-window and full-attention layers (served by the hybrid KV cache manager).
MOE_HYBRID_MODELS = "qwen3-30b-a3b,gemma-2-9b"


#: Chat at rate inf (its throughput is the capacity the loads after it take shares of) and
#: at 85 % of it, block 16: the first two runs of several plans.
CHAT_CAPACITY = {
    "name": "chat-inf-bs16",
    "workload": "chat",
    "rate": "inf",
    "block_size": 16,
    "num_prompts": 150,
}
CHAT_85 = {"name": "chat-85pct-bs16", "workload": "chat", "rate": 0.85, "block_size": 16}


def _moe_hybrid_plan() -> list[dict]:
    """Each model of `MOE_HYBRID_MODELS`, after its calibration at block 16: chat at rate inf
    (its throughput is the capacity), then chat at 85 % of it, then both again (`-r2`, the
    second pass after the first)."""
    first = [CHAT_CAPACITY, CHAT_85]
    return first + [{**spec, "name": spec["name"] + "-r2"} for spec in first]


def dry_model(name: str) -> str:
    """The tiny model a dry run stands in for `name` with: one of its kind (MoE, hybrid
    attention or dense)."""
    from pagesim.specs import ModelSpec

    spec = ModelSpec.from_name(name)
    return "tiny-moe" if spec.is_moe else "tiny-hybrid" if spec.is_hybrid else "tiny-llama"


def _serve_plan() -> list[dict]:
    """Call B: llama-2-7b's chat at 85 % of the capacity measured first, on every block size,
    then bursty chat, the shipped multi-turn sessions (closed loop, all sessions at once),
    long outputs (bwb at rate inf), a conversation trace at its own arrivals, chat at 50 and
    95 % and system-prompt (prefix sharing, at 85 % of chat's capacity); then all of them
    again (`-r2`), so that each load has a repeat minutes later. Chat at 85 % takes about
    20 s a run, multi-turn about 80 s (its think times), the others about 20-30 s; the whole
    plan overruns one 10-minute call, so a call names the runs it leaves out
    (`--skip-runs`), and the budget check skips what no longer fits."""
    inf = {"rate": "inf", "block_size": 16}
    first = [{"name": "chat-inf-bs16", "workload": "chat", **inf, "num_prompts": 150}]
    loads = [
        {
            "name": f"chat-85pct-bs{bs}",
            "workload": "chat",
            "rate": 0.85,
            "block_size": bs,
            "num_prompts": 48,
        }
        for bs in (16, 64, 8, 32, 128)
    ]
    loads += [
        {
            "name": "chat-bursty-85pct-bs16",
            "workload": "chat",
            "rate": 0.85,
            "block_size": 16,
            "burstiness": 0.5,
            "num_prompts": 48,
        },
        {"name": "multi-turn-inf-bs16", "workload": "multi-turn", **inf, "num_prompts": 40},
        {"name": "bwb-inf-bs16", "workload": "bwb", **inf, "num_prompts": 12},
        {
            "name": "conversation-trace-bs16",
            "workload": "conversation",
            "rate": None,
            "block_size": 16,
            "num_prompts": 30,
        },
    ]
    loads += [
        {"name": f"chat-{pct}pct-bs16", "workload": "chat", "rate": pct / 100, "block_size": 16}
        for pct in (50, 95)
    ]
    loads.append(
        {
            "name": "system-prompt-chat85pct-bs16",
            "workload": "system-prompt",
            "rate": 0.85,
            "block_size": 16,
            "num_prompts": 48,
        }
    )
    return first + loads + [{**spec, "name": spec["name"] + "-r2"} for spec in loads]


#: Tiny stand-ins of the shipped loads for a dry run: lengths the tiny model's 256-token
#: context holds. A multi-turn spec and a trace are written by `write_dry_workloads`.
DRY_MULTI_TURN = "dry-multi-turn.yaml"
DRY_TRACE = "dry-trace.csv"


def dry_stand_in(spec: dict) -> dict:
    """`spec` with its workload swapped for a tiny one of the same kind: closed-loop sessions
    for multi-turn, a trace at its own arrivals for a trace replay, random prompts for the
    rest; the name, block size, rate and burstiness are kept."""
    out = {k: v for k, v in spec.items() if k != "workload"}
    if spec["workload"] == "multi-turn":
        return {**out, "workload": DRY_MULTI_TURN, "num_prompts": 5}
    if spec.get("rate") is None:  # a trace replay at its own timestamps
        return {**out, "workload": DRY_TRACE, "num_prompts": 4}
    return {
        **out,
        "workload": "random",
        "num_prompts": 3,
        "random_input_len": 24,
        "random_output_len": 3,
    }


def write_dry_workloads(folder: Path) -> None:
    """The files `dry_stand_in` names, in `folder` (the working folder of a dry run)."""
    (folder / DRY_MULTI_TURN).write_text(
        "name: dry-multi-turn\n"
        "description: tiny closed-loop sessions for a dry run\n"
        "lengths:\n"
        "  input: {dist: uniform, low: 8, high: 24}\n"
        "  output: {dist: uniform, low: 2, high: 4}\n"
        "sessions:\n"
        "  turns: {dist: uniform, low: 2, high: 3}\n"
        "  think_time_s: {dist: exponential, mean: 0.05}\n"
        "  max_context_tokens: 200\n"
        "arrival: {process: poisson, rate: 20}\n"
    )
    (folder / DRY_TRACE).write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        "0.00,20,3\n0.05,33,2\n0.30,12,4\n0.32,40,3\n"
    )


def _repeat_plan() -> list[dict]:
    base = [
        CHAT_CAPACITY,
        CHAT_85,
        {
            "name": "system-prompt-inf-bs16",
            "workload": "system-prompt",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        },
        {
            "name": "system-prompt-85pct-bs16",
            "workload": "system-prompt",
            "rate": 0.85,
            "block_size": 16,
            "of": "system-prompt-inf-bs16",
        },
        {
            "name": "code-inf-bs16",
            "workload": "code",
            "rate": "inf",
            "block_size": 16,
            "num_prompts": 150,
        },
        {
            "name": "code-85pct-bs16",
            "workload": "code",
            "rate": 0.85,
            "block_size": 16,
            "of": "code-inf-bs16",
        },
        {"name": "chat-85pct-bs32", "workload": "chat", "rate": 0.85, "block_size": 32},
    ]
    plan = []
    for spec in base:
        plan += [spec, {**spec, "name": spec["name"] + "-r2"}]
    return plan


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--models", default=None, help=f"default: llama-2-7b ({MOE_HYBRID_MODELS} for moe-hybrid)"
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--calib-budget-s", type=float, default=150.0)
    ap.add_argument(
        "--decode-batches",
        default=None,
        help="decode batch sizes to calibrate, comma separated (default: the grid's)",
    )
    ap.add_argument(
        "--full-block-sizes",
        default=None,
        help="block sizes calibrated with every table, comma separated (default: the grid's)",
    )
    ap.add_argument("--arrival-window-s", type=float, default=10.0)
    ap.add_argument(
        "--max-prompts",
        type=int,
        default=200,
        help="cap on a Poisson run's prompts (rate x arrival window)",
    )
    ap.add_argument("--skip-runs", default="")
    ap.add_argument(
        "--calibrate-only", action="store_true", help="Profiles only (the real runs already exist)."
    )
    ap.add_argument(
        "--probe",
        action="store_true",
        help="time speed_probe's fixed steps before every run and after the last",
    )
    ap.add_argument(
        "--plan",
        choices=("validate", "repeat", "drift", "oos", "calibrate", "serve", "moe-hybrid"),
        default="validate",
        help="repeat: the runs that missed targets, each served twice in a row; calibrate: "
        "the full grid only (call A); serve: no calibration, the out-of-sample loads twice "
        "(call B); moe-hybrid: an MoE and a hybrid model, checked, calibrated at block 16, "
        "chat at capacity and at 85 %% of it, twice",
    )
    ap.add_argument(
        "--passes",
        type=int,
        default=1,
        help="serve the plan this many times, the repeats named <name>-r2, ...",
    )
    ap.add_argument(
        "--pass-runs",
        default="",
        help="the runs the later passes serve, comma separated (default: all)",
    )
    ap.add_argument("--dry-run-cpu", action="store_true")
    ap.add_argument(
        "--enforce-eager", action="store_true", help="No CUDA graphs (calibration and runs)."
    )
    args = ap.parse_args()
    if args.models is None:
        args.models = MOE_HYBRID_MODELS if args.plan == "moe-hybrid" else "llama-2-7b"
    from pagesim.utils import parse_int_list  # a bad list fails before any GPU work

    decode_batches = (
        None
        if args.decode_batches is None
        else tuple(sorted(set(parse_int_list(args.decode_batches, "decode-batches"))))
    )
    full = (
        {}
        if args.full_block_sizes is None
        else {"full_block_sizes": tuple(parse_int_list(args.full_block_sizes, "full-block-sizes"))}
    )
    skip = set(filter(None, args.skip_runs.split(",")))
    plan = [spec for spec in run_plan(args.dry_run_cpu, args.plan) if spec["name"] not in skip]
    pass_runs = set(filter(None, args.pass_runs.split(","))) or None
    unknown = (pass_runs or set()) - {spec["name"] for spec in plan}
    if unknown:
        ap.error(f"--pass-runs: not in the plan: {', '.join(sorted(unknown))}")
    plan += later_passes(plan, args.passes, pass_runs)
    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    logf = open(out / "session.log", "a", encoding="utf-8")
    sys.stdout = Tee(sys.__stdout__, logf)
    sys.stderr = Tee(sys.__stderr__, logf)
    dry = args.dry_run_cpu
    graphs_on = not args.enforce_eager
    calibrate_only = args.calibrate_only or args.plan == "calibrate"
    serve_only = args.plan == "serve"  # the model and its KV capacity, no grid
    # moe-hybrid: block 16 only, every table, in --calib-budget-s
    one_block = {"block_sizes": (16,), "full_block_sizes": (16,)}
    if args.plan == "moe-hybrid":
        full = {**full, **one_block}
    if dry:
        write_dry_workloads(work)
        plan = [
            {**spec, "workload": str(work / spec["workload"])}
            if spec["workload"] in (DRY_MULTI_TURN, DRY_TRACE)
            else spec
            for spec in plan
        ]
    if dry:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.setdefault("TRITON_CACHE_DIR", str(Path(".triton_cache").resolve()))
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import CalibrationGrid
    from pagesim.gpu.device import ClockSampler, device_info
    from pagesim.gpu.profiler import gpu_key, load_model, run_calibration
    from pagesim.validate.serve import serve_workload
    from pagesim.validate.store import load_dict, save_real_run

    device = "cpu" if dry else "cuda"
    dtype = torch.float32 if dry else torch.bfloat16
    info = device_info(None if dry else device)
    log(f"device {info}")
    summary: dict = {"device": info, "models": {}, "cuda_graphs": graphs_on}
    for name in args.models.split(","):
        ms: dict = {"runs": {}}
        summary["models"][name] = ms
        try:
            if dry:
                config = EngineConfig.create(
                    model=dry_model(name),
                    block_size=16,
                    max_num_seqs=4,
                    max_num_batched_tokens=64,
                    max_model_len=256,
                    num_gpu_blocks_override=128,
                )
                grid = CalibrationGrid(
                    block_sizes=full.get("block_sizes")
                    or tuple(
                        sorted(
                            {16, 32, *full.get("full_block_sizes", ())}
                            | ({8, 64, 128} if args.plan == "calibrate" else set())
                        )
                    ),
                    full_block_sizes=full.get(
                        "full_block_sizes",
                        (8, 16, 32, 64, 128) if args.plan == "calibrate" else (16, 32),
                    ),
                    decode_batches=(1, 2),
                    decode_contexts=(16, 40),
                    prefill_tokens=(16,),
                    prefill_cached=(0,),
                    mixed=((8, 0, 2, 16),),
                    decode_shared_spread=((2, 16, 16, 8),),
                    overhead_max_reqs=4,
                    repeats=3,
                )
                if args.plan == "moe-hybrid":
                    err = check_model(config.model, dtype, device)
                    ms["check_rel_err"] = err
                    log(f"{config.model}: paged vs dense forward rel err {err:.2e}")
            else:
                # the card this call holds (an H100 may be lent for an H200), so that its
                # runs record what served them
                gpu = "h200" if dry else gpu_key(info["gpu_name"])
                config = EngineConfig.create(model=name, gpu=gpu, block_size=16)
                grid = (
                    CalibrationGrid(**full)
                    if decode_batches is None
                    else CalibrationGrid(decode_batches=decode_batches, **full)
                )
                err = check_model(name, dtype, device)
                ms["check_rel_err"] = err
                log(
                    f"{name}: paged vs dense forward rel err {err:.2e} "
                    f"({'ok' if err < 3e-2 else 'TOO LARGE'})"
                )
            if serve_only:  # call B: what serving needs, nothing measured beyond it
                sizes = tuple(sorted({spec["block_size"] for spec in plan} | {16}))
                model, capacity = load_model(config, sizes, dtype=dtype, device=device)
                log(capacity.report())
                ms["capacity"] = capacity.to_dict()
            else:
                # Leave time for the runs after the grid (none with --calibrate-only: then only
                # for the host-overhead replay and packing, ~15 s after the grid's budget).
                reserve = CALIBRATE_ONLY_RESERVE_S if calibrate_only else RUNS_RESERVE_S
                calib_budget = min(args.calib_budget_s, max(30.0, left(args.budget_s) - reserve))
                with ClockSampler() as clocks:
                    res = run_calibration(
                        config,
                        grid,
                        dtype=dtype,
                        calibration_root=work / "calibration",
                        progress=lambda d, t, lab: (
                            log(f"  [{d}/{t}] {lab}") if d == t or d % 20 == 0 else None
                        ),
                        time_budget_s=calib_budget,
                        log=log,
                        device=device,
                        cuda_graphs=graphs_on,
                    )
                ms["calibration_clocks"] = clocks.summary()
                ms["calibration_s"] = res.elapsed_s
                ms["capacity"] = res.capacity.to_dict()
                ms["profile_rows"] = {
                    k: len(getattr(res.profile, k))
                    for k in (
                        "decode",
                        "prefill",
                        "mixed",
                        "multi_prefill",
                        "overhead",
                        "decode_shared",
                        "decode_shared_spread",
                    )
                }
                log(f"{name}: calibrated in {res.elapsed_s:.0f} s: {ms['profile_rows']}")
                pack(out, work)
                model, capacity = res.model, res.capacity
                del res  # it holds the calibration's runner: its memory must go with the model
            if (
                graphs_on
                and not dry
                and not calibrate_only
                and not serve_only
                and args.plan != "moe-hybrid"  # its runs report their graphs
            ):
                try:
                    bs0 = config.block_size
                    model.set_block_size(bs0)
                    with ClockSampler() as clocks:
                        ms["graph_vs_eager"] = graph_vs_eager(
                            config, model, capacity.num_gpu_blocks[bs0], dry
                        )
                    ms["graph_vs_eager_clocks"] = clocks.summary()
                    (work / f"graph_vs_eager_{name}.json").write_text(
                        json.dumps(
                            {"rows": ms["graph_vs_eager"], "sm_clock": clocks.summary()}, indent=1
                        )
                    )
                except Exception:  # a diagnostic: the runs still go ahead
                    log(f"graph_vs_eager FAILED\n{traceback.format_exc()}")
                if device == "cuda":
                    torch.cuda.empty_cache()
            throughput: dict[str, float] = {}  # run name -> measured request throughput
            cfg = None
            for spec in [] if calibrate_only else plan:
                rate = spec["rate"]
                base = throughput.get(spec.get("of", "chat-inf-bs16"))
                if rate not in ("inf", None) and not dry:
                    if base is None:
                        log(f"skip {spec['name']}: no capacity measured")
                        continue
                    rate = round(rate * base, 3)
                n = spec.get("num_prompts") or int(
                    min(args.max_prompts, max(60, round((rate or 0) * args.arrival_window_s)))
                )
                remaining = left(args.budget_s)
                if remaining < (20 if dry else 45):
                    log(f"skip {spec['name']}: {remaining:.0f} s left")
                    continue
                bs = spec["block_size"]
                cfg = config.replace(block_size=bs)
                blocks = capacity.num_gpu_blocks[bs]
                params = {k: v for k, v in spec.items() if k.startswith("random_")}
                load = load_dict(
                    spec["workload"],
                    n,
                    0,
                    math.inf if rate == "inf" else rate,
                    spec.get("burstiness", 1.0),
                    **params,
                )
                if args.probe:
                    ms.setdefault("probes", {})[f"before {spec['name']}"] = speed_probe(
                        cfg, model, blocks, dry, graphs_on and device == "cuda"
                    )
                t = time.monotonic()
                with ClockSampler() as clocks:
                    result, records = serve_workload(
                        cfg,
                        model,
                        blocks,
                        load,
                        device=device,
                        max_wall_s=remaining - 15,
                        cuda_graphs=graphs_on,
                        log=log,
                    )
                records["sm_clock_mhz"] = clocks.samples
                result["sm_clock"] = clocks.summary()
                if device == "cuda":
                    torch.cuda.empty_cache()
                save_real_run(
                    work / "real" / name / f"{spec['name']}.json.xz",
                    config=cfg,
                    load=load,
                    result=result,
                    records=records,
                    device=info,
                    extra={"capacity_rps": base, "sm_clock": clocks.summary()},
                )
                throughput[spec["name"]] = result["request_throughput"]
                ms["runs"][spec["name"]] = {
                    k: result[k]
                    for k in (
                        "completed",
                        "failed",
                        "duration",
                        "request_throughput",
                        "output_throughput",
                        "mean_ttft_ms",
                        "mean_tpot_ms",
                        "mean_e2el_ms",
                        "p99_e2el_ms",
                        "num_preemptions",
                        "prefix_cache_hit_rate",
                        "truncated",
                        "gpu_host_overhead_s_mean",
                        "sm_clock",
                        "gpu_cuda_graphs",
                        "gpu_graphs_captured",
                        "gpu_graph_capture_s",
                        "gpu_graph_error",
                    )
                }
                log(
                    f"{name} {spec['name']}: rate {rate} n {n} in {time.monotonic() - t:.0f} s: "
                    + json.dumps(ms["runs"][spec["name"]])
                )
                pack(out, work)
            if args.probe and cfg is not None:
                ms.setdefault("probes", {})["after the last run"] = speed_probe(
                    cfg, model, blocks, dry, graphs_on and device == "cuda"
                )
            del model, capacity
            gc.collect()  # captured graphs and runners refer to each other
            if device == "cuda":
                torch.cuda.empty_cache()
        except Exception:  # keep going: the next model may still run
            ms["error"] = traceback.format_exc()
            log(f"{name}: FAILED\n{ms['error']}")
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        pack(out, work)
    cache = Path(os.environ.get("TRITON_CACHE_DIR", ".triton_cache"))
    if not dry and cache.is_dir():
        with tarfile.open(out / "triton_cache.tar.gz", "w:gz") as tar:
            tar.add(cache, arcname=".triton_cache")
        log(f"triton cache packed: {(out / 'triton_cache.tar.gz').stat().st_size / 2**20:.1f} MiB")
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
