"""The multi-GPU session: tensor-parallel calibration and validation runs (no torchrun).

    PYTHONPATH=. python3 benchmarks/gpu_tp_session.py --model llama-3-70b --tp 2,4,8 \\
        --validate-tp 2,4 --budget-s 1500 --out $OUT          # 8 x H200, one node
    PYTHONPATH=. python3 benchmarks/gpu_tp_session.py --model llama-3-70b --tp 2 \\
        --validate-tp 2 --block-sizes 16 --budget-s 565 --calib-budget-s 160 --out $OUT
                                          # 2 x H200 in one 10-minute call (results/validation/tp2)
    PYTHONPATH=. python3 benchmarks/gpu_tp_session.py --model llama-3-70b --tp 2 \\
        --validate-tp 2 --block-sizes 16 --budget-s 578 --calib-budget-s 140 --cuda-graphs \\
        --out $OUT                        # the same with CUDA graphs (results/validation/tp2_graphs)
    PYTHONPATH=. python3 benchmarks/gpu_tp_session.py --tp 2 --dry-run-cpu --out /tmp/tp
                                                              # the same flow, 2 CPU processes

Per TP degree N (processes spawned with `pagesim.gpu.parallel.launch`, rank r on cuda:r, NVLink
multicast off in every process): (1) the sharded forward of a 2-layer variant of the model
against the unsharded one on every rank (NCCL correctness); (2) `calibrate_tensor_parallel`:
KV capacity per rank (the group's minimum kept), the step grid through rank 0's broadcast,
host overhead, the all-reduce table, saved as calibration/<gpu>/<model>-tp<N>/; (3) for N in
--validate-tp, real runs through the scheduler on rank 0 and `TPDriverRunner` (chat at rate inf,
whose throughput is the measured capacity, then chat at 50/85 % of it), stored as real runs.
Then on any CPU:

    pagesim validate --real <out>/work/real/<model>-tp<N>/*.json \\
        --profile <out>/work/calibration/h200/<model>-tp<N>

Everything goes under --out: work/ (profiles, real runs) packed into session.tar.gz after each
phase, session.log, summary.json. With --cuda-graphs, every validated degree also times fixed
steps replayed as graphs against the same steps run eagerly, and compares their outputs
(`graph_vs_eager-tp<N>.json`), before its real runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tarfile
import time
import traceback
from pathlib import Path

T0 = float(os.environ.setdefault("PAGESIM_TP_SESSION_T0", repr(time.time())))  # spawned ranks
# inherit the parent's start, so that logs and the time budget count from one instant


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def pack(out: Path) -> None:
    tmp = out / "session.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out / "work", arcname="work")
    os.replace(tmp, out / "session.tar.gz")


def check_equivalence(group, spec, dtype, device) -> float:
    """Relative error of the TP forward (prefill, no attention) against the whole model, on a
    2-layer variant of `spec` (the same draws on every rank)."""
    import torch

    from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
    from pagesim.gpu.tp_model import TensorParallelDecoder

    small = dataclasses.replace(spec, num_layers=2)
    weights = DecoderConfig(small, dtype, device, 16, seed=5)
    full = RandomWeightDecoder(weights)
    shard = TensorParallelDecoder(weights, group)
    ids = torch.arange(97, device=device) * 31 % small.vocab_size
    pos = torch.arange(97, device=device)
    rows = torch.tensor([40, 96], device=device)
    a = full.compute_logits(full.forward(ids, pos, None, None, rows, skip_attention=True))
    b = shard.compute_logits(shard.forward(ids, pos, None, None, rows, skip_attention=True))
    err = float((a - b).norm() / a.norm())
    del full, shard
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return err


def session_rank(rank: int, world_size: int, init_method: str, args: dict) -> None:
    """One process of a TP-N group: check, calibrate, then serve the real runs rank 0 picks."""
    import torch

    from pagesim.config import EngineConfig
    from pagesim.gpu.calibrate import CalibrationGrid
    from pagesim.gpu.memory import MemorySnapshot
    from pagesim.gpu.model import DecoderConfig
    from pagesim.gpu.parallel import destroy_tensor_parallel, init_tensor_parallel
    from pagesim.gpu.tp_model import TensorParallelDecoder
    from pagesim.gpu.tp_profiler import calibrate_tensor_parallel, graph_vs_eager_tp

    dry = args["dry"]
    device = torch.device("cpu" if dry else f"cuda:{rank}")
    dtype = torch.float32 if dry else torch.bfloat16
    out = Path(args["out"])
    group = init_tensor_parallel(rank, world_size, init_method, device)
    say = log if rank == 0 else (lambda _msg: None)
    summary: dict = {"tp": world_size}
    try:
        if dry:
            torch.set_num_threads(1)
            config = EngineConfig.create(
                model="tiny-llama",
                block_size=16,
                max_num_seqs=4,
                max_num_batched_tokens=64,
                max_model_len=256,
                num_gpu_blocks_override=128,
                tensor_parallel_size=world_size,
            )
            grid = CalibrationGrid(
                block_sizes=(16,),
                full_block_sizes=(16,),
                decode_batches=(1, 2),
                decode_contexts=(16, 40),
                prefill_tokens=(16,),
                prefill_cached=(0,),
                mixed=(),
                overhead_max_reqs=4,
                repeats=3,
            )
            sizes = (1024, 65536)
        else:
            config = EngineConfig.create(
                model=args["model"], gpu="h200", block_size=16, tensor_parallel_size=world_size
            )
            sizes_asked = tuple(args["block_sizes"])
            grid = CalibrationGrid(
                block_sizes=sizes_asked,
                full_block_sizes=tuple(
                    b for b in CalibrationGrid.full_block_sizes if b in sizes_asked
                ),
            )
            sizes = None
        err = check_equivalence(group, config.model_spec, dtype, device)
        summary["equivalence_rel_err"] = group.gather_objects(err)
        say(
            f"TP {world_size}: sharded vs whole 2-layer logits, rel err per rank "
            f"{summary['equivalence_rel_err']}"
        )
        before = MemorySnapshot.take(device) if device.type == "cuda" else None
        model = TensorParallelDecoder(
            DecoderConfig(config.model_spec, dtype, device, config.block_size), group
        )
        kw = {"allreduce_bytes": sizes} if sizes else {}
        res = calibrate_tensor_parallel(
            group,
            model,
            config,
            grid,
            before=before,
            seed=0,
            calibration_root=out / "work" / "calibration",
            log=say,
            time_budget_s=args["calib_budget_s"],
            cuda_graphs=args["cuda_graphs"],
            **kw,
        )
        blocks = None
        if res is not None:
            p = res.profile
            blocks = res.capacity.num_gpu_blocks[config.block_size]
            summary.update(
                profile=str(res.directory),
                calibration_s=res.elapsed_s,
                capacity=res.capacity.to_dict(),
                rows={
                    k: len(getattr(p, k))
                    for k in ("decode", "prefill", "mixed", "overhead", "allreduce")
                },
                allreduce=[dataclasses.asdict(r) for r in p.allreduce],
            )
            say(f"TP {world_size}: profile {res.directory} {summary['rows']}")
            pack(out)
        if args["cuda_graphs"] and world_size in args["validate_tp"]:
            t = time.time()
            shapes = {"decode 1x40": [(40, 1)], "prefill 24": [(0, 24)]} if dry else None
            rows = graph_vs_eager_tp(
                group, model, config, blocks or 0, shapes, reps=3 if dry else 10, log=say
            )
            if rows is not None:
                summary["graph_vs_eager"] = rows
                (out / "work" / f"graph_vs_eager-tp{world_size}.json").write_text(
                    json.dumps(rows, indent=1)
                )
                say(f"TP {world_size}: graph vs eager in {time.time() - t:.0f} s")
        if world_size in args["validate_tp"]:
            summary["runs"] = serve_runs(group, model, config, blocks, args, say)
    except Exception:
        summary["error"] = traceback.format_exc()
        print(f"rank {rank}: FAILED\n{summary['error']}", flush=True)
        raise
    finally:
        if rank == 0:
            (out / f"summary-tp{world_size}.json").write_text(
                json.dumps(summary, indent=1, default=str)
            )
            pack(out)
        destroy_tensor_parallel()


def run_plan(dry: bool) -> list[dict]:
    """Real runs in priority order; `rate` is "inf" or a fraction of the measured capacity."""
    if dry:
        rnd = {"random_input_len": 24, "random_output_len": 3}
        return [
            {
                "name": "random-inf-bs16",
                "workload": "random",
                "rate": "inf",
                "num_prompts": 4,
                **rnd,
            }
        ]
    return [
        {"name": "chat-inf-bs16", "workload": "chat", "rate": "inf", "num_prompts": 150},
        {"name": "chat-50pct-bs16", "workload": "chat", "rate": 0.50},
        {"name": "chat-85pct-bs16", "workload": "chat", "rate": 0.85},
    ]


def serve_runs(group, model, config, blocks, args, say) -> dict:
    """Rank 0 picks each run (or skips it) and broadcasts the pick; every rank serves it."""
    from pagesim.gpu.device import device_info
    from pagesim.gpu.tp_profiler import serve_tp
    from pagesim.validate.serve import build_requests
    from pagesim.validate.store import load_dict, load_spec, save_real_run

    out = Path(args["out"])
    runs: dict = {}
    capacity_rps = None
    for spec in run_plan(args["dry"]):
        pick = None
        if group.is_driver:
            remaining = args["budget_s"] - (time.time() - T0)
            rate = spec["rate"]
            if rate != "inf":
                rate = None if capacity_rps is None else round(rate * capacity_rps, 3)
            if remaining > 60 and rate is not None:
                n = spec.get("num_prompts") or int(min(200, max(60, round(rate * 10))))
                params = {k: v for k, v in spec.items() if k.startswith("random_")}
                pick = load_dict(
                    spec["workload"], n, 0, math.inf if rate == "inf" else rate, **params
                )
                pick["max_wall_s"] = remaining - 45
            else:
                say(f"skip {spec['name']}: {remaining:.0f} s left, rate {rate}")
        pick = group.broadcast_object(pick)
        if pick is None:
            continue
        if not group.is_driver:
            serve_tp(group, model, config, 0)
            continue
        load = {k: v for k, v in pick.items() if k != "max_wall_s"}
        requests = build_requests(config, load_spec(load))
        t = time.time()
        result, records = serve_tp(
            group,
            model,
            config,
            blocks,
            requests,
            max_wall_s=pick["max_wall_s"],
            cuda_graphs=args["cuda_graphs"],
        )
        name = f"{config.model}-tp{config.tensor_parallel_size}"
        save_real_run(
            out / "work" / "real" / name / f"{spec['name']}.json.xz",
            config=config,
            load=load,
            result=result,
            records=records,
            device=device_info(model.device if model.device.type == "cuda" else None),
            extra={
                "capacity_rps": capacity_rps,
                "tensor_parallel_size": config.tensor_parallel_size,
            },
        )
        if spec["name"].startswith("chat-inf") or args["dry"]:
            capacity_rps = result["request_throughput"]
        runs[spec["name"]] = {
            k: result[k]
            for k in (
                "completed",
                "request_throughput",
                "output_throughput",
                "mean_ttft_ms",
                "mean_tpot_ms",
                "p99_e2el_ms",
                "num_preemptions",
                "truncated",
                "gpu_cuda_graphs",
                "gpu_graphs_captured",
                "gpu_graph_capture_s",
                "gpu_graph_error",
            )
        }
        say(f"{name} {spec['name']} in {time.time() - t:.0f} s: " + json.dumps(runs[spec["name"]]))
        pack(out)
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--tp", default="2,4,8", help="TP degrees to calibrate, in order")
    ap.add_argument("--validate-tp", default="2,4", help="TP degrees that also get real runs")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--budget-s", type=float, default=1500.0)
    ap.add_argument("--calib-budget-s", type=float, default=240.0)
    ap.add_argument(
        "--block-sizes",
        default="8,16,32,64,128",
        help="block sizes to calibrate (16 and 32 get the full grid, the others "
        "decode rows); must hold 16, the runs' block size",
    )
    ap.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture CUDA graphs on every rank, NCCL all-reduces inside them "
        "(run benchmarks/nccl_graph_check.py first); default eager",
    )
    ap.add_argument("--dry-run-cpu", action="store_true")
    a = ap.parse_args()
    sizes = [int(x) for x in a.block_sizes.split(",") if x]
    if 16 not in sizes:
        print(
            f"error: --block-sizes {a.block_sizes}: must hold 16, the runs' block size",
            file=sys.stderr,
        )
        return 2
    out = Path(a.out)
    (out / "work").mkdir(parents=True, exist_ok=True)
    if a.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # inherited by the spawned ranks
    from pagesim.gpu.parallel import launch

    args = {
        "dry": a.dry_run_cpu,
        "model": a.model,
        "out": str(out),
        "budget_s": a.budget_s,
        "calib_budget_s": a.calib_budget_s,
        "block_sizes": sizes,
        "cuda_graphs": a.cuda_graphs,
        "validate_tp": [int(x) for x in a.validate_tp.split(",") if x],
    }
    failed = []
    for tp in [int(x) for x in a.tp.split(",") if x]:
        if not a.dry_run_cpu:
            import torch

            if torch.cuda.device_count() < tp:
                log(f"TP {tp}: skipped, {torch.cuda.device_count()} GPUs here")
                continue
        log(f"TP {tp}: starting {tp} processes")
        try:
            launch(session_rank, tp, args)
        except Exception as e:  # keep going: a smaller degree may still have run
            failed.append(tp)
            log(f"TP {tp}: FAILED ({type(e).__name__}: {e})")
    log("done" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
