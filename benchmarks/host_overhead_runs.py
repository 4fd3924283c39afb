"""Host time per engine step in served runs against the profile's host-overhead table.

The profile's `overhead.csv` comes from a replay of a decode ramp (256 short prompts that
arrive together and finish one by one). A served run's loop also admits requests with long
prompts (hashing their blocks, looking up and allocating them) and frees long block lists.
Per real run: the median host time (`schedule_s + update_s`: what the loop spends outside
`execute_model`, idle waits excluded) of decode-only steps and of steps with prefill entries,
beside what the profile's table gives for the same batch sizes; and, over the steps with
prefill entries of all runs, a least-squares line of the excess over the table against the
number of prefill entries.

    python benchmarks/host_overhead_runs.py --real results/validation/staged_inputs/real/llama-2-7b \\
        --profile calibration/h200/llama-2-7b [--out results/validation/host_overhead_llama-2-7b.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.validate import read_real_run, real_run_files


def table_ms(cm: CalibratedCostModel, num_reqs: int) -> float:
    """The profile's host overhead (ms) for a step of `num_reqs` requests."""
    if not num_reqs:
        return 0.0
    return cm.step_time_breakdown(BatchShape.decode(num_reqs, 1))["host_overhead"] * 1e3


def run_rows(path: Path, cm: CalibratedCostModel) -> tuple[dict, list[tuple[int, float]]]:
    """(row of the table, [(prefill entries, excess ms)] of its steps with prefill)."""
    doc = read_real_run(path)
    st, rs = doc["records"]["steps"], doc["records"]["runner_steps"]
    host = (np.asarray(st["schedule_s"]) + np.asarray(st["update_s"])) * 1e3
    reqs = np.asarray(rs["num_reqs"])
    entries = reqs - np.asarray(rs["num_decode_reqs"])
    table = np.array([table_ms(cm, int(n)) for n in reqs])
    dec = np.asarray(rs["num_prefill_tokens"]) == 0
    row = {
        "run": path.name.split(".")[0],
        "decode_steps": int(dec.sum()),
        "decode_host_ms": float(np.median(host[dec])),
        "decode_table_ms": float(np.median(table[dec])),
        "prefill_steps": int((~dec).sum()),
        "prefill_host_ms": float(np.median(host[~dec])) if (~dec).any() else float("nan"),
        "prefill_table_ms": float(np.median(table[~dec])) if (~dec).any() else float("nan"),
        "prefill_entries_mean": float(entries[~dec].mean()) if (~dec).any() else 0.0,
    }
    return row, [
        (int(e), float(h - t))
        for e, h, t in zip(entries[~dec], host[~dec], table[~dec], strict=True)
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True, help="folder of real-run files (.json.xz)")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", default=None, help="markdown table (default: print only)")
    args = ap.parse_args()
    cm = CalibratedCostModel(Profile.load(args.profile))
    lines = [
        f"Host time per step: real runs {args.real}, profile {args.profile}",
        "",
        "median ms of schedule + update per step; table: the profile's overhead.csv at "
        "the step's batch",
        "",
        "| run | decode steps | host | table | prefill steps | host | table | entries per step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    excess: list[tuple[int, float]] = []
    for path in real_run_files(args.real):
        row, ex = run_rows(path, cm)
        excess += ex
        lines.append(
            f"| {row['run']} | {row['decode_steps']} | {row['decode_host_ms']:.3f} | "
            f"{row['decode_table_ms']:.3f} | {row['prefill_steps']} | "
            f"{row['prefill_host_ms']:.3f} | {row['prefill_table_ms']:.3f} | "
            f"{row['prefill_entries_mean']:.2f} |"
        )
    if excess:
        x = np.array([[1.0, e] for e, _ in excess])
        y = np.array([v for _, v in excess])
        a, b = np.linalg.lstsq(x, y, rcond=None)[0]
        lines += [
            "",
            f"Steps with prefill entries ({len(y)}): host - table = {a:.3f} ms + "
            f"{b:.3f} ms per prefill entry (least squares)",
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
