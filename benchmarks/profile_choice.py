"""Which calibration to ship: every GPU call's profile priced on every call's real runs.

A profile is measured in one GPU call, on one machine on one day, and prices that call's runs
best: the host's speed inside and between steps moves from call to call
(`benchmarks/host_in_step.py`). A user who runs `pagesim run` with the shipped profile is in
the position of another call. So the shipped profile is judged on the runs of every stored
call of its model, and the choice is checked leave-one-call-out: for each call, the profile
that meets the most targets on the other calls' runs (never the call's own) is taken and
scored on the held-out call. The sum over calls estimates the targets a shipped profile meets
on a call it has not seen.

    python benchmarks/profile_choice.py --model llama-2-7b \\
        [--out results/validation/profile_choice_llama-2-7b]

Prints the table and writes `<out>.md` and `<out>.csv` (profile x call: targets met).
"""

from __future__ import annotations

import argparse
import csv
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from grid_ablation import RESULTS, SKIP, folder_of, real_runs, targets_met

SHIPPED = RESULTS.parents[1] / "calibration" / "h200"


def candidates(model: str) -> dict[str, Path]:
    """"shipped" and every call folder's own profile of `model`."""
    out = {"shipped": SHIPPED / model}
    for prof in sorted(RESULTS.glob(f"*/profile/h200/{model}")):
        if prof.parents[2].name not in SKIP:
            out[prof.parents[2].name] = prof
    return out


def same_profile(a: Path, b: Path) -> bool:
    """Whether two profile folders hold the same files, byte for byte."""
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def made_by(profiles: dict[str, Path], call: str) -> set[str]:
    """The candidates a call measured: its own folder's, and "shipped" if it is a copy of
    that one (the first calls' folder, `real/`, keeps no profile: the shipped one is its)."""
    mine = {call} & profiles.keys()
    if call == "real" or (call in profiles and same_profile(profiles[call],
                                                             profiles["shipped"])):
        mine.add("shipped")
    return mine


def matrix(model: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(profile -> call -> targets met, call -> targets) over every stored run of `model`."""
    runs = real_runs(model)
    profiles = candidates(model)
    jobs = [(run, prof) for prof in profiles.values() for run in runs]
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(targets_met, jobs, chunksize=8))
    met: dict[str, dict[str, int]] = {name: {} for name in profiles}
    totals: dict[str, int] = {}
    names = [name for name in profiles for _ in runs]
    for name, (run, _), (m, n) in zip(names, jobs, results, strict=True):
        call = folder_of(run)
        met[name][call] = met[name].get(call, 0) + m
        if name == "shipped":
            totals[call] = totals.get(call, 0) + n
    return met, totals


def report(model: str, met: dict[str, dict[str, int]], totals: dict[str, int],
           profiles: dict[str, Path]) -> str:
    calls = sorted(totals)
    total = sum(totals.values())
    mine = {call: made_by(profiles, call) for call in calls}
    lines = [f"{model}: every profile on every call's runs, targets met ({len(calls)} calls, "
             f"{total} targets).", "",
             "| profile | all calls | its own call's runs |", "| --- | ---: | ---: |"]
    for name in sorted(met, key=lambda p: (-sum(met[p].values()), p)):
        own_calls = [c for c in calls if name in mine[c]]
        own_cell = " ".join(f"{met[name][c]}/{totals[c]}" for c in own_calls) or "-"
        lines.append(f"| {name} | {sum(met[name].values())} | {own_cell} |")
    lines += ["", "Leave one call out: the profile with the most targets on the other calls' "
              "runs, scored on the held-out call.", "",
              "| held-out call | chosen profile | its targets | own profile | shipped |",
              "| --- | --- | ---: | ---: | ---: |"]
    loo = own_sum = 0
    for call in calls:
        others = [p for p in met if p not in mine[call]]
        best = max(others, key=lambda p: (sum(v for c, v in met[p].items() if c != call), p))
        loo += met[best][call]
        own_name = min(mine[call]) if mine[call] else None
        own_met = met[own_name][call] if own_name else None
        own_sum += own_met or 0
        own_cell = f"{own_met}/{totals[call]}" if own_name else "-"
        lines.append(f"| {call} | {best} | {met[best][call]}/{totals[call]} | {own_cell} | "
                     f"{met['shipped'][call]}/{totals[call]} |")
    lines += ["", f"Leave-one-call-out total: {loo} of {total}; each call's own profile: "
              f"{own_sum} of {total}; the shipped profile: {sum(met['shipped'].values())} of "
              f"{total}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", help="stem of the markdown and CSV outputs (default: print only)")
    args = ap.parse_args()
    if not real_runs(args.model):
        raise SystemExit(f"no stored real runs of {args.model!r} under {RESULTS}")
    met, totals = matrix(args.model)
    text = report(args.model, met, totals, candidates(args.model))
    print(text)
    if args.out:
        Path(f"{args.out}.md").write_text(text, encoding="utf-8")
        calls = sorted(totals)
        with open(f"{args.out}.csv", "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(["profile", *calls])
            w.writerow(["targets", *(totals[c] for c in calls)])
            for name, row in met.items():
                w.writerow([name, *(row.get(c, 0) for c in calls)])


if __name__ == "__main__":
    main()
