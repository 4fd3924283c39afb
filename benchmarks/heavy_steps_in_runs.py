"""Eager prefill steps of stored real runs: priced against their time, by what ran before them.

For every GPU call given (a folder of real runs and the profile of that call), every eager step
with a prefill entry (a heavy step: more tokens than the largest mixed graph) is rebuilt by
replaying its run's schedule (`step_replay.replay_shapes`), priced by the call's profile
(device time) and compared with the runner's wall time. Steps are grouped by the kind of run
(Poisson arrivals or rate inf), by the light steps (graph replays) right before them and by
their tokens; the table gives each group's mean error and its error weighted by step time,
and the SM clock (the run's trace) averaged over the heavy steps of 3,000 tokens or more.

    python benchmarks/heavy_steps_in_runs.py --model llama-2-7b \\
        --call results/validation/rebuilt_inputs/real:results/validation/rebuilt_inputs/profile/h200 \\
        --call results/validation/rerun/real:results/validation/rerun/profile/h200 ...

Why: a heavy step that follows light ones runs at a higher clock than one in a burst of heavy
steps (`benchmarks/heavy_after_light.py`); this shows what that does to the served runs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from step_replay import replay_shapes

from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.validate import read_json_file, real_run_files


def heavy_steps(path: Path, cm: CalibratedCostModel) -> list[dict]:
    """One dict per heavy step of the run: error %, wall s, tokens, light steps before it,
    mean SM clock during it (0 without samples)."""
    doc = read_json_file(path)
    if "records" not in doc:
        return []
    rs, st = doc["records"]["runner_steps"], doc["records"]["steps"]
    clock = np.array(doc["records"].get("sm_clock_mhz") or [[0.0, 0.0]])
    shapes = replay_shapes(doc)
    out, light = [], 0
    for i, wall in enumerate(rs["wall_s"]):
        shape = shapes[i]
        if shape is None or not rs["num_reqs"][i]:
            continue
        if rs["cuda_graph"][i] or not shape.num_prefill_reqs:
            light += 1
            continue
        t0 = st["start_s"][i]
        during = clock[(clock[:, 0] >= t0) & (clock[:, 0] <= t0 + st["execute_s"][i]), 1]
        out.append(
            {
                "err": 100.0 * (cm.device_time(shape) / wall - 1.0),
                "wall": wall,
                "tokens": shape.total_tokens,
                "light_before": light,
                "clock": float(during.mean()) if len(during) else 0.0,
            }
        )
        light = 0
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument(
        "--call",
        action="append",
        required=True,
        help="REAL_DIR:PROFILE_DIR (the folders holding <model>/)",
    )
    args = ap.parse_args()
    steps: dict[str, list[dict]] = {"poisson": [], "inf": []}
    for call in args.call:
        real, prof = call.split(":")
        cm = CalibratedCostModel(Profile.load(Path(prof) / args.model))
        for path in real_run_files(Path(real) / args.model):
            kind = "inf" if "-inf-" in path.name else "poisson"
            steps[kind] += heavy_steps(path, cm)
    groups = {
        "Poisson runs": steps["poisson"],
        "rate-inf runs": steps["inf"],
        "Poisson, >= 5 light steps before": [s for s in steps["poisson"] if s["light_before"] >= 5],
        "Poisson, 1-4 light steps before": [
            s for s in steps["poisson"] if 1 <= s["light_before"] < 5
        ],
        "Poisson, right after a heavy step": [
            s for s in steps["poisson"] if s["light_before"] == 0
        ],
        "Poisson, >= 3,000 tokens": [s for s in steps["poisson"] if s["tokens"] >= 3000],
        "rate inf, >= 3,000 tokens": [s for s in steps["inf"] if s["tokens"] >= 3000],
    }
    print(f"{args.model}: heavy (eager prefill) steps, predicted vs real device time\n")
    print("| steps | n | mean error % | time-weighted error % | SM clock MHz (>= 3,000 tokens) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, sel in groups.items():
        if not sel:
            continue
        e = np.array([s["err"] for s in sel])
        w = np.array([s["wall"] for s in sel])
        clocks = [s["clock"] for s in sel if s["tokens"] >= 3000 and s["clock"] > 0]
        clock = f"{np.mean(clocks):.0f}" if clocks else ""
        print(
            f"| {label} | {len(sel)} | {e.mean():+.2f} | {np.sum(e * w) / w.sum():+.2f} | {clock} |"
        )


if __name__ == "__main__":
    main()
