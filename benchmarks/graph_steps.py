"""Real step times of the CUDA-graph runner against the calibrated profile, step by step.

Reads the stored real runs (results/validation/decode_graphs/real/llama-2-7b/*.json.xz, whose
`records.runner_steps` say per step whether it replayed a graph and at which padded batch) and
prices each step with `CalibratedCostModel` on results/validation/decode_graphs/profile/h200/llama-2-7b (device part: the
model's step time minus its host-overhead term, against the runner's `wall_s`). Decode steps
are priced exactly (batch, mean context); prefill/mixed steps approximately (the records keep
sums only: prefill tokens split evenly over the prefill entries, no cached prefix), so the
eager rows of the prefix-cached run are not meaningful.

    python benchmarks/graph_steps.py   -> results/validation/decode_graphs/graph_steps.{json,md}
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.validate import read_json_file, real_run_files

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "results" / "validation" / "decode_graphs"
REAL = GEN / "real" / "llama-2-7b"
PROFILE = GEN / "profile" / "h200" / "llama-2-7b"
OUT = GEN


def shape(rs: dict, i: int, bs: int) -> BatchShape:
    nr, nd = rs["num_reqs"][i], rs["num_decode_reqs"][i]
    npf, ctx = rs["num_prefill_tokens"][i], rs["context_sum"][i]
    if npf == 0:
        return BatchShape.decode(nd, max(1, round(ctx / nd)), bs)
    npre = nr - nd
    each = npf // npre
    return BatchShape(
        bs,
        nd + npf,
        nd,
        ctx,
        [ctx // max(nd, 1)] * nd,
        [each] * (npre - 1) + [npf - each * (npre - 1)],
        [0] * npre,
    )


def run_rows(path: Path, cm: CalibratedCostModel) -> dict:
    doc = read_json_file(path)
    rs = doc["records"]["runner_steps"]
    bs = doc["engine_config"]["block_size"]
    by: dict[tuple, list] = {}
    for i, wall in enumerate(rs["wall_s"]):
        if rs["num_reqs"][i] == 0:
            continue
        pred = cm.device_time(shape(rs, i, bs))
        key = ("graph", rs["padded_reqs"][i]) if rs["cuda_graph"][i] else ("eager", 0)
        by.setdefault(key, []).append((wall * 1e3, pred * 1e3, rs["num_reqs"][i]))
    rows = []
    for (kind, size), v in sorted(by.items()):
        a = np.asarray(v)
        rows.append(
            {
                "kind": kind,
                "padded_batch": size,
                "steps": len(a),
                "real_ms_median": round(float(np.median(a[:, 0])), 2),
                "pred_ms_median": round(float(np.median(a[:, 1])), 2),
                "real_s_sum": round(float(a[:, 0].sum() / 1e3), 3),
                "pred_s_sum": round(float(a[:, 1].sum() / 1e3), 3),
                "median_pred_over_real": round(float(np.median(a[:, 1] / a[:, 0])), 3),
                "batch_min": int(a[:, 2].min()),
                "batch_max": int(a[:, 2].max()),
            }
        )
    return {"run": path.name.split(".")[0], "block_size": bs, "rows": rows}


def markdown(runs: list[dict]) -> str:
    head = (
        "| run | kind | padded batch | batches | steps | real ms (median) | "
        "predicted ms (median) | real s (sum) | predicted s (sum) |"
    )
    lines = [head, "|" + " --- |" * 9]
    for r in runs:
        for x in r["rows"]:
            if x["steps"] < 10:
                continue
            lines.append(
                f"| {r['run']} | {x['kind']} | {x['padded_batch'] or '-'} | "
                f"{x['batch_min']}-{x['batch_max']} | {x['steps']} | "
                f"{x['real_ms_median']} | {x['pred_ms_median']} | {x['real_s_sum']} | "
                f"{x['pred_s_sum']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    cm = CalibratedCostModel(Profile.load(PROFILE))
    runs = [run_rows(p, cm) for p in real_run_files(REAL)]
    (OUT / "graph_steps.json").write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    md = markdown(runs)
    (OUT / "graph_steps.md").write_text(md, encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
