"""Tensor parallelism as the analytical model sees it: KV capacity, step cost and throughput
per GPU of one replica at TP 1, 2, 4, 8 (no GPU; every number is a model's prediction).

    PYTHONPATH=. python3 benchmarks/tp_analytical.py [--model llama-3-70b] [--gpu h200]

Per TP degree: KV blocks and tokens per GPU (vLLM's start-up arithmetic), the all-reduce share
of a decode step (64 sequences over 2048 tokens) and of a 2048-token prefill, and a saturated
chat run (200 prompts at rate inf) with its output tokens/s per replica and per GPU
(output_throughput / tp: the planning layer's y axis). Writes results/tp_analytical.csv.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.errors import ConfigError
from pagesim.kvcache.sizing import kv_capacity
from pagesim.sim.simulate import LoadSpec, simulate


def row(model: str, gpu: str, tp: int, num_prompts: int) -> dict:
    config = EngineConfig.create(model=model, gpu=gpu, tensor_parallel_size=tp)
    try:
        cap = kv_capacity(config)
    except ConfigError as e:
        return {"tp": tp, "error": str(e)}
    cm = AnalyticalCostModel(config.model_spec, config.gpu_spec, tensor_parallel_size=tp)
    decode = cm.step_time_breakdown(BatchShape.decode(64, 2048))
    prefill = cm.step_time_breakdown(BatchShape.prefill(2048))
    sim = simulate(
        config, LoadSpec(workload="chat", num_prompts=num_prompts, request_rate=math.inf)
    )
    out = sim.result["output_throughput"]
    return {
        "tp": tp,
        "num_gpu_blocks": cap.num_gpu_blocks,
        "kv_tokens_per_gpu": cap.num_tokens,
        "kv_bytes_per_token": cap.kv_bytes_per_token,
        "decode_64x2048_ms": 1e3 * sum(decode.values()),
        "decode_allreduce_ms": 1e3 * decode["allreduce"],
        "prefill_2048_ms": 1e3 * sum(prefill.values()),
        "prefill_allreduce_ms": 1e3 * prefill["allreduce"],
        "output_tok_s": out,
        "output_tok_s_per_gpu": out / tp,
        "mean_tpot_ms": sim.result["mean_tpot_ms"],
        "error": "",
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3-70b")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--out", default="results/tp_analytical.csv")
    a = ap.parse_args()
    rows = [row(a.model, a.gpu, tp, a.num_prompts) for tp in (1, 2, 4, 8)]
    cols = [
        "tp",
        "num_gpu_blocks",
        "kv_tokens_per_gpu",
        "kv_bytes_per_token",
        "decode_64x2048_ms",
        "decode_allreduce_ms",
        "prefill_2048_ms",
        "prefill_allreduce_ms",
        "output_tok_s",
        "output_tok_s_per_gpu",
        "mean_tpot_ms",
        "error",
    ]
    print(f"{a.model} on {a.gpu}, analytical cost model, chat x{a.num_prompts} at rate inf")
    print(" | ".join(cols[:-1]))
    for r in rows:
        if r.get("error"):
            print(f"{r['tp']} | {r['error']}")
            continue
        print(
            " | ".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols[:-1])
        )
    path = Path(a.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in cols})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
