"""Host and device time inside served decode steps, call by call, against the profile's price.

A served step's time is `GPUModelRunner.execute_model`'s host wall clock: building and copying
the inputs, launching the graph, the device's work, and the sync that reads the sampled
tokens. The runner also times the device's part with CUDA events (forward, LM head and
sampler), so each decode-graph step splits into device time and host time (the rest of the
wall clock). The same workload and seed serve the same requests in every GPU call, so a run
kind's steps can be followed from call to call: if the device part holds still while the
host part moves, a call's pricing error is the host's speed that day, which no cost model of
the step can know.

Per call and run: decode-graph steps, their mean wall, device and host time (ms), the
prediction of that call's own profile and its error on the summed time, and the host time
between those steps (scheduling and bookkeeping, outside `execute_model`) beside what the
call's profile measured for it (its overhead table at the same batch sizes). Per run over
calls: how far each part spreads, and how closely the host time inside the steps follows
each of the two host times between them (Pearson's r, from 5 calls).

    python benchmarks/host_in_step.py --model llama-3-8b \\
        --runs system-prompt-85pct-bs16,chat-85pct-bs16 [--out results/validation/host_in_step_llama-3-8b]
    python benchmarks/host_in_step.py --model llama-3-8b --staged \\
        --out results/validation/host_in_step_llama-3-8b_staged
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path

import numpy as np
from gpu_calls import EAGER_RUNNER, PARTIAL, REPEATED, SKIP, STAGED_RUNNER, call_runs, profile_of
from host_overhead_runs import table_ms
from step_replay import replay_shapes

from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.validate import read_real_run, real_run_files


def calls(model: str, staged: bool = False) -> list[tuple[str, Path, Path]]:
    """(call, real-run folder, profile folder) of every stored GPU call of `model` with CUDA
    graphs: by the runners that rebuilt their inputs each step (decode graphs only, or decode
    and mixed graphs), or with `staged` by the staged one. The call that served two models on
    one host is kept: its host time is part of the story; a call whose calibration was cut
    short (`gpu_calls.PARTIAL`) is not, having no profile to price its steps, nor a call of
    repeated runs (`gpu_calls.REPEATED`), which would count a load two or three times."""

    def keep(runner: str | None) -> bool:
        if staged:
            return runner == STAGED_RUNNER
        return runner not in (STAGED_RUNNER, EAGER_RUNNER, None)

    return [
        (call, d, profile_of(call, model))
        for call, d in call_runs(model, keep, skip=PARTIAL | REPEATED)
    ]


def base_run(run: str) -> str:
    """A run's name without its repeat suffix (`-r2`: the same run served again)."""
    return re.sub(r"-r\d+$", "", run)


def run_row(path: Path, cm: CalibratedCostModel) -> dict | None:
    """One run's decode-graph steps: mean wall, device and host ms, predicted ms, error %."""
    doc = read_real_run(path)
    rs = doc["records"]["runner_steps"]
    if "forward_s" not in rs:
        return None
    st = doc["records"]["steps"]
    shapes = replay_shapes(doc)
    wall, dev, prep, pred, between, table = [], [], [], [], [], []
    for i, w in enumerate(rs["wall_s"]):
        s = shapes[i]
        if s is None or s.num_prefill_reqs or not rs["cuda_graph"][i]:
            continue
        wall.append(w)
        dev.append(rs["forward_s"][i] + rs["sample_s"][i])
        prep.append(rs["prepare_s"][i])
        pred.append(cm.device_time(s))
        between.append(st["schedule_s"][i] + st["update_s"][i])
        table.append(table_ms(cm, rs["num_reqs"][i]) / 1e3)
    if not wall:
        return None
    w, d, q, p, b, t = (np.asarray(x) * 1e3 for x in (wall, dev, prep, pred, between, table))
    return {
        "steps": len(w),
        "wall_ms": w.mean(),
        "device_ms": d.mean(),
        "host_ms": (w - d).mean(),
        "prepare_ms": q.mean(),
        "pred_ms": p.mean(),
        "err_pct": 100 * (p.sum() / w.sum() - 1),
        "between_ms": b.mean(),
        "profile_between_ms": t.mean(),
    }


def call_rows(model: str, staged: bool, wanted: set[str]) -> list[dict]:
    """`run_row` of every run (or the `wanted` ones) of every call of one runner."""
    rows = []
    for call, real, prof in calls(model, staged):
        cm = CalibratedCostModel(Profile.load(prof))
        for path in real_run_files(real):
            run = path.name.split(".")[0]
            if wanted and run not in wanted:
                continue
            row = run_row(path, cm)
            if row is not None:
                rows.append({"run": run, "call": call, **row})
    rows.sort(key=lambda r: (r["run"], r["call"]))
    return rows


def staged_vs_before(staged: list[dict], before: list[dict]) -> list[str]:
    """Markdown lines: each staged call's host and prepare time per run against the median
    and range over the calls before it, one GPU to a host (not `gpu_calls.SKIP`'s
    `two_at_once`, which shared its host)."""
    lines = [
        "",
        "Each staged call's host time inside the step (prepare in brackets) against "
        "the calls before it, alone on their host: median and range over calls, ms.",
        "",
        "| run | call | host (prepare) | before: median host (prepare) | before: host "
        "range | calls before | host / median |",
        "| --- | --- | ---: | ---: | --- | ---: | ---: |",
    ]
    ratios = []
    for r in staged:
        old = [
            b for b in before if base_run(b["run"]) == base_run(r["run"]) and b["call"] not in SKIP
        ]
        if not old:
            continue
        host = float(np.median([b["host_ms"] for b in old]))
        prep = float(np.median([b["prepare_ms"] for b in old]))
        lo, hi = min(b["host_ms"] for b in old), max(b["host_ms"] for b in old)
        ratios.append(r["host_ms"] / host)
        lines.append(
            f"| {r['run']} | {r['call']} | {r['host_ms']:.3f} ({r['prepare_ms']:.3f})"
            f" | {host:.3f} ({prep:.3f}) | {lo:.2f}-{hi:.2f} | {len(old)} | "
            f"{r['host_ms'] / host:.2f} |"
        )
    if ratios:
        lines += [
            "",
            f"{sum(x < 1 for x in ratios)} of {len(ratios)} below the median; host "
            f"/ median: median {np.median(ratios):.2f}, range {min(ratios):.2f}-"
            f"{max(ratios):.2f}.",
        ]
    return lines


def _corr(a: list[float], b: list[float]) -> str:
    """Pearson's r of two columns over calls, or "-" with fewer than 5 calls."""
    return f"{np.corrcoef(a, b)[0, 1]:+.2f}" if len(a) >= 5 else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", default="", help="run names, comma separated (default: all)")
    ap.add_argument("--out", help="stem of the markdown and CSV tables (default: print only)")
    ap.add_argument(
        "--staged",
        action="store_true",
        help="the calls of the runner with staged inputs (default: the calls "
        "before it, which rebuilt the inputs each step)",
    )
    args = ap.parse_args()
    wanted = set(filter(None, args.runs.split(",")))
    rows = call_rows(args.model, args.staged, wanted)
    lines = [
        f"Decode-graph steps of {args.model}'s served runs, call by call: device time (CUDA "
        "events: forward, LM head, sampler), host time (the rest of the step's wall "
        "clock; prepare: its part that builds and copies the inputs), and the call's own "
        "profile's price (error on the summed time).",
        "",
        "Host between steps (scheduling and bookkeeping outside `execute_model`): the "
        "run's, and the call's profile's overhead table at the same batch sizes.",
        "",
        "| run | call | steps | wall ms | device ms | host ms | prepare ms | predicted ms "
        "| error % | between ms | profile's between ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['run']} | {r['call']} | {r['steps']} | {r['wall_ms']:.3f} | "
        f"{r['device_ms']:.3f} | {r['host_ms']:.3f} | {r['prepare_ms']:.3f} | "
        f"{r['pred_ms']:.3f} | "
        f"{r['err_pct']:+.1f} | {r['between_ms']:.3f} | {r['profile_between_ms']:.3f} |"
        for r in rows
    ]
    lines += [
        "",
        "Per run (repeats included), over calls: the spread (max / min - 1) of each part's mean.",
        "",
        "| run | calls | device spread % | host spread % | host ms min-max | "
        "error % min-max | r(host, between) | r(host, profile's between) |",
        "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |",
    ]
    for run in sorted({base_run(r["run"]) for r in rows}):
        rr = [r for r in rows if base_run(r["run"]) == run]
        dv = [r["device_ms"] for r in rr]
        hs = [r["host_ms"] for r in rr]
        er = [r["err_pct"] for r in rr]
        lines.append(
            f"| {run} | {len(rr)} | {100 * (max(dv) / min(dv) - 1):.1f} | "
            f"{100 * (max(hs) / min(hs) - 1):.0f} | {min(hs):.2f}-{max(hs):.2f} | "
            f"{min(er):+.1f} to {max(er):+.1f} | "
            f"{_corr(hs, [r['between_ms'] for r in rr])} | "
            f"{_corr(hs, [r['profile_between_ms'] for r in rr])} |"
        )
    if args.staged:
        lines += staged_vs_before(rows, call_rows(args.model, False, wanted))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(f"{args.out}.md").write_text(text, encoding="utf-8")
        with open(f"{args.out}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(
                {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows
            )


if __name__ == "__main__":
    main()
