"""Steps run with CUDA-graph replay and eagerly in one runner: their host time and outputs.

A graph is only worth replaying if it computes what the eager step computes, and only worth
capturing if it is faster. Both are checked on the same runner and KV cache, alternating the
two modes step by step so that both see the same machine state: the same step run twice writes
the same K/V, so both read the same cache, and their final hidden rows should agree up to the
summation order: a padded step changes the row count cuBLAS sees, and a decode graph splits
contexts for its span bucket where the eager step splits them for its longest context. Each
decode row says both splits; where they cut contexts at other offsets the split-K reduction
sums in another order, and once a reordered sum rounds to another bf16 value the rows drift
apart over the layers. A shape split alike in both modes gives bit-identical rows.

`use_graphs(on)` switches the runner between modes: on one GPU it sets `runner.graphs`; a
tensor-parallel driver broadcasts the switch so that every rank replays or runs eagerly alike
(`TPDriverRunner.use_graphs`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pagesim.cost.decode_launch import DecodePartition, partition_cuts
from pagesim.gpu.calibrate import BlockSource, synthetic_step

#: Shapes checked by default: (context, new tokens) per entry, decodes first.
DEFAULT_SHAPES: dict[str, list[tuple[int, int]]] = {
    "decode 1x512": [(512, 1)],
    "decode 8x512": [(512, 1)] * 8,
    "decode 64x512": [(512, 1)] * 64,
    "decode 256x512": [(512, 1)] * 256,
    "prefill 128": [(0, 128)],
    "prefill 500 over 1024 cached": [(1024, 500)],
    "32 decodes x512 + chunk 256": [(512, 1)] * 32 + [(0, 256)],
    "4 prefills x 64 over 1024 cached": [(1024, 64)] * 4,
}

#: Warm-up calls per mode before timing (the first captures the graph and compiles).
WARMUP = 2


def split_label(part: DecodePartition) -> str:
    """ "2x320": partitions x tokens each; "1" when unsplit."""
    return "1" if part.num_partitions == 1 else f"{part.num_partitions}x{part.partition_size}"


def decode_splits(graphs, spec: list[tuple[int, int]]) -> dict:
    """For a decode-only shape (one new token per entry) on a runner with `graphs`: the
    padded graph size, the eager and the graph split, and whether they cut contexts alike
    (`partition_cuts`); {} for any other shape."""
    if graphs is None or not spec or any(n != 1 for _, n in spec):
        return {}
    size = graphs.padded_size(len(spec))
    if size is None:  # larger than every captured size: runs eagerly either way
        return {}
    longest = max(ctx for ctx, _ in spec) + 1
    eager, graph = graphs.decode_partitions(len(spec), longest)
    return {
        "graph_size": size,
        "eager_split": split_label(eager),
        "graph_split": split_label(graph),
        "same_split": partition_cuts(eager, longest) == partition_cuts(graph, longest),
    }


def graph_vs_eager_rows(
    runner,
    use_graphs: Callable[[bool], None],
    shapes: dict[str, list[tuple[int, int]]],
    *,
    reps: int = 10,
    modes: tuple[str, ...] = ("graph", "eager"),
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per shape: median and p90 host ms of `execute_model` per mode and, with both
    modes, the relative difference of the final hidden rows. `modes=("graph",)` times the
    steps as a served run would run them (no eager twin). Graphs are left on at the end."""
    blocks = runner.num_gpu_blocks
    rows = []
    graphs = runner.graphs
    for label, spec in shapes.items():
        out = synthetic_step(spec, runner.block_size, BlockSource(blocks, 0))
        if out is None:
            continue  # its K/V does not fit this cache
        times: dict[str, list[float]] = {mode: [] for mode in modes}
        hidden = {}
        for i in range(reps + WARMUP):
            for mode in modes:
                use_graphs(mode == "graph")
                t = time.perf_counter()
                runner.execute_model(out)
                if i >= WARMUP:
                    times[mode].append(time.perf_counter() - t)
                hidden[mode] = runner.last_hidden.float().clone()
        use_graphs(True)
        if len(modes) == 1:
            ms = 1e3 * statistics.median(times[modes[0]])
            rows.append({"shape": label, "reps": reps, "mode": modes[0], "ms": ms})
            continue
        err = float((hidden["graph"] - hidden["eager"]).norm() / hidden["eager"].norm())
        p90 = min(reps - 1, int(0.9 * reps))
        rows.append(
            {
                "shape": label,
                "num_reqs": len(spec),
                "num_tokens": sum(n for _, n in spec),
                "reps": reps,
                "graph_ms": 1e3 * statistics.median(times["graph"]),
                "eager_ms": 1e3 * statistics.median(times["eager"]),
                "graph_ms_p90": 1e3 * sorted(times["graph"])[p90],
                "eager_ms_p90": 1e3 * sorted(times["eager"])[p90],
                "hidden_rel_diff": err,
                "graph_failed": graphs.failed if graphs is not None else None,
                **decode_splits(graphs, spec),
            }
        )
        if log is not None:
            r = rows[-1]
            split = (
                ""
                if r.get("same_split", True)
                else f", decode split {r['eager_split']} eagerly, {r['graph_split']} as a graph"
            )
            log(
                f"  {label}: graph {r['graph_ms']:.2f} ms, eager {r['eager_ms']:.2f} ms, "
                f"hidden rel diff {err:.1e}{split}"
                + (f" (graphs FAILED: {r['graph_failed']})" if r["graph_failed"] else "")
            )
    return rows
