"""Can a CUDA graph hold the TP model's NCCL all-reduces here? (2+ GPUs)

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. python3 benchmarks/nccl_graph_check.py --tp 2 --out $OUT

The TP runner's graph capture puts `torch.distributed` NCCL all-reduces inside CUDA graphs.
This checks exactly that on a new machine or stack, in the runner's pattern, on one process per
GPU (`pagesim.gpu.parallel.launch`, multicast off); on 2 x H200 with torch 2.11 and NCCL
2.28.9 it passed (`results/validation/tp2_graphs/nccl_graph_check.json`):

1. capture `layers` all-reduces of a decode step's hidden states ([tokens, hidden] bf16) in one
   graph, each followed by a scale, and replay it: every rank must get the sum of all ranks'
   inputs through the whole chain, replay after replay, with new inputs copied in;
2. eager all-reduces between and after replays (the runner mixes graph and eager steps): they
   must still complete and agree, which a desynchronised process group would not;
3. the time of one replay against the same chain run eagerly (what graphs buy the host).

Rank 0 prints one line per check and writes `nccl_graph_check.json` under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def rank_main(
    rank: int, world_size: int, init_method: str, out: str, layers: int, tokens: int, hidden: int
) -> None:
    import torch
    import torch.distributed as dist

    from pagesim.gpu.parallel import init_tensor_parallel

    device = torch.device(f"cuda:{rank}")
    group = init_tensor_parallel(rank, world_size, init_method, device, timeout_s=60.0)
    pg = group.device_group
    facts: dict = {
        "tp": world_size,
        "layers": layers,
        "tokens": tokens,
        "hidden": hidden,
        "torch": torch.__version__,
        "nccl": str(torch.cuda.nccl.version()),
    }
    static = torch.zeros(tokens, hidden, dtype=torch.bfloat16, device=device)

    def chain(x: torch.Tensor) -> torch.Tensor:
        for _ in range(layers):
            dist.all_reduce(x, group=pg)
            x = x * (1.0 / world_size)  # keeps the values put: each layer's sum, averaged
        return x

    def inputs(k: int) -> torch.Tensor:
        return torch.full(
            (tokens, hidden), float(rank + 1 + k), dtype=torch.bfloat16, device=device
        )

    def expected(k: int) -> float:  # the mean over ranks of (r + 1 + k), after any depth
        return sum(r + 1 + k for r in range(world_size)) / world_size

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):  # warm-up on the capture stream, as graph capture wants
        for _ in range(2):
            static.copy_(inputs(0))
            chain(static.clone())
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    t = time.perf_counter()
    with torch.cuda.graph(graph, stream=stream):
        result = chain(static.clone())
    torch.cuda.synchronize(device)
    facts["capture_s"] = time.perf_counter() - t
    ok = True
    for k in range(1, 6):
        static.copy_(inputs(k))
        graph.replay()
        torch.cuda.synchronize(device)
        ok &= bool(torch.allclose(result.float(), torch.full_like(result.float(), expected(k))))
        x = inputs(k + 10)
        dist.all_reduce(x, group=pg)  # eager between replays
        torch.cuda.synchronize(device)
        ok &= bool(
            torch.allclose(x.float(), torch.full_like(x.float(), world_size * expected(k + 10)))
        )
    facts["replays_correct"] = ok
    y = chain(inputs(3))
    torch.cuda.synchronize(device)
    facts["eager_after_correct"] = bool(
        torch.allclose(y.float(), torch.full_like(y.float(), expected(3)))
    )

    def timed(fn, n: int = 20) -> float:
        times = []
        for _ in range(n):
            torch.cuda.synchronize(device)
            dist.barrier(group=group.cpu_group)
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] * 1e3

    facts["replay_ms"] = timed(graph.replay)
    facts["eager_ms"] = timed(lambda: chain(static.clone()))
    if rank == 0:
        for k in ("replays_correct", "eager_after_correct", "capture_s", "replay_ms", "eager_ms"):
            print(f"{k}: {facts[k]}", flush=True)
        Path(out, "nccl_graph_check.json").write_text(json.dumps(facts, indent=1))
    torch.cuda.synchronize(device)
    # a process group that captured NCCL work may hang in destroy (pytorch#115388): leave
    # without it once the facts are written
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument(
        "--layers",
        type=int,
        default=160,
        help="all-reduces in the graph (two per layer of an 80-layer model)",
    )
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=8192)
    a = ap.parse_args()
    import torch

    if torch.cuda.device_count() < a.tp:
        print(
            f"error: --tp {a.tp} needs {a.tp} CUDA GPUs, {torch.cuda.device_count()} here",
            file=sys.stderr,
        )
        return 2
    from pagesim.gpu.parallel import launch

    Path(a.out).mkdir(parents=True, exist_ok=True)
    launch(rank_main, a.tp, a.out, a.layers, a.tokens, a.hidden)
    return 0


if __name__ == "__main__":
    sys.exit(main())
