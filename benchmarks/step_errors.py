"""Per-step errors of a calibrated profile on stored real runs, by kind of step.

Each real run (`pagesim validate`'s real-run files) keeps its runner's per-step records:
wall time, whether the step replayed a decode graph or a mixed-step graph or ran eagerly.
Every step's members are rebuilt by replaying its schedule (`step_replay.replay_shapes`:
exact decode contexts, prefill entries and shared prefix references), priced
by `CalibratedCostModel` (device part: its step time minus the host-overhead term) and
compared with the runner's wall time (a TP run's: the driver's whole step, broadcast
included). Per run and kind: steps, share of the run's step time,
the error of the summed time (what moves the run's metrics) and the per-step MAPE.

    python benchmarks/step_errors.py --real results/validation/staged_inputs/real/llama-2-7b \\
        --profile calibration/h200/llama-2-7b [--out results/validation/step_errors_llama-2-7b.md]

`--decode-spans` splits the decode-graph steps by padded batch and by the power of two that
their longest context rounds up to (the graph's span bucket, which sets the decode kernel's
partitions). `--no-shared` prices every context as private (shared prefix reads at full
cost), to see what the shared-block rule does.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from step_replay import replay_shapes

from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.decode_launch import span_bucket
from pagesim.cost.profile import Profile
from pagesim.validate import read_json_file, real_run_files


def step_kind(rs: dict, i: int, num_entries: int) -> str:
    if not rs["cuda_graph"][i]:
        return f"eager, {min(num_entries, 4)}{'+' if num_entries > 4 else ''} prefill"
    if rs.get("mixed_graph", [False] * (i + 1))[i]:
        return f"mixed graph, {min(num_entries, 4)}{'+' if num_entries > 4 else ''} prefill"
    return "decode graph"


def run_table(
    path: Path, cm: CalibratedCostModel, spans: bool = False, shared: bool = True
) -> list[dict]:
    doc = read_json_file(path)
    if "records" not in doc:  # not a real run (summary, diagnostics)
        return []
    rs = doc["records"]["runner_steps"]
    # A TP driver's step is its broadcast of the step (1.4-1.6 ms for llama-3-70b at TP 2)
    # and its own shard's forward; the calibration timed both, the runner's record the second.
    tp = doc["engine_config"].get("tensor_parallel_size", 1) > 1
    walls = doc["records"]["steps"]["execute_s"] if tp else rs["wall_s"]
    shapes = replay_shapes(doc)
    by: dict[str, list[tuple[float, float]]] = {}
    total = 0.0
    for i, wall in enumerate(walls):
        if not rs["num_reqs"][i]:
            continue
        total += wall
        shape = shapes[i]
        if shape is None:  # past a step the replay could not rebuild: left out
            continue
        if not shared:
            shape = dataclasses.replace(shape, shared_context_tokens=None)
        kind = step_kind(rs, i, shape.num_prefill_reqs)
        if spans and kind == "decode graph":
            span = span_bucket(
                max(shape.decode_context_tokens) + 1, doc["engine_config"]["max_model_len"]
            )
            kind = f"decode graph, {rs['padded_reqs'][i]:>3} seqs, longest < {span:>4}"
        by.setdefault(kind, []).append((wall, cm.device_time(shape)))
    rows = []
    for kind, v in sorted(by.items()):
        a = np.asarray(v)
        rows.append(
            {
                "kind": kind,
                "steps": len(a),
                "share_pct": round(100 * a[:, 0].sum() / total, 1),
                "real_ms_mean": round(1e3 * a[:, 0].mean(), 2),
                "time_err_pct": round(100 * (a[:, 1].sum() / a[:, 0].sum() - 1), 1),
                "mape_pct": round(float(100 * np.mean(np.abs(a[:, 1] / a[:, 0] - 1))), 1),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--real", required=True, help="folder of real-run files (.json, .json.gz or .json.xz)"
    )
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", default=None, help="markdown table (default: print only)")
    ap.add_argument(
        "--no-shared", action="store_true", help="price shared prefix reads as private ones"
    )
    ap.add_argument(
        "--decode-spans",
        action="store_true",
        help="decode-graph steps by padded batch and span bucket",
    )
    args = ap.parse_args()
    cm = CalibratedCostModel(Profile.load(args.profile))
    lines = [
        f"Per-step errors: real runs {args.real}, profile {args.profile}",
        "",
        "error > 0: predicted slow; time err: of the kind's summed time",
        "",
        "| run | kind | steps | share of step time % | real mean ms | time err % | MAPE % |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for path in real_run_files(args.real):
        for r in run_table(path, cm, args.decode_spans, not args.no_shared):
            lines.append(
                f"| {path.name.split('.')[0]} | {r['kind']} | {r['steps']} | "
                f"{r['share_pct']} | {r['real_ms_mean']} | {r['time_err_pct']:+} | "
                f"{r['mape_pct']} |"
            )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
