"""Which calibration to ship: every GPU call's profile priced on every call's real runs.

A profile is measured in one GPU call, on one machine on one day, and prices that call's runs
best: the host's speed inside and between steps moves from call to call
(`benchmarks/host_in_step.py`). A user who runs `pagesim run` with the shipped profile is in
the position of another call. So the shipped profile is judged on the runs of every stored
call of its model, and the choice is checked leave-one-call-out, two ways: for each call, the
single profile that meets the most targets on the other calls' runs (never the call's own),
and the median of the other calls' profiles (`pagesim merge-profiles`), each scored on the
held-out call. The sums over calls estimate the targets a shipped profile meets on a call it
has not seen. "median" in the matrix is the median of every call's profile (it has seen every
call). Only calls of one runner are compared (`gpu_calls.py`): by default the runner the
shipped profile measured.

    python benchmarks/profile_choice.py --model llama-2-7b [--runner staged|rebuilt] \\
        [--out results/validation/profile_choice_llama-2-7b]

Prints the table and writes `<out>.md` and `<out>.csv` (profile x call: targets met).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gpu_calls import (
    REBUILT_RUNNER,
    RESULTS,
    SHIPPED,
    STAGED_RUNNER,
    call_profiles,
    folder_of,
    real_runs,
    shipped_runner,
)
from grid_ablation import targets_met

from pagesim.cost.profile import Profile, ProfileError
from pagesim.cost.profile_merge import merge_profiles

#: --runner's choices
RUNNERS = {"staged": STAGED_RUNNER, "rebuilt": REBUILT_RUNNER}


def candidates(model: str, runner: str) -> dict[str, Path]:
    """Every call folder's own profile of `model` measured with `runner`, and "shipped" if the
    shipped profile measured that runner too."""
    shipped = {"shipped": SHIPPED / model} if shipped_runner(model) == runner else {}
    return {**shipped, **call_profiles(model, runner)}


def same_profile(a: Path, b: Path) -> bool:
    """Whether two profile folders hold the same files, byte for byte."""
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def made_by(profiles: dict[str, Path], call: str) -> set[str]:
    """The candidates a call measured: its own folder's, and "shipped" if it is a copy of
    that one."""
    mine = {call} & profiles.keys()
    if {"shipped", call} <= profiles.keys() and same_profile(profiles[call], profiles["shipped"]):
        mine.add("shipped")
    return mine


#: the candidate that is the median of every call's profile
MEDIAN = "median"


def merged(profiles: list[Path], out: Path) -> Path:
    """The median of `profiles` (`pagesim.cost.profile_merge`), written to `out`."""
    return merge_profiles([Profile.load(p) for p in profiles]).save(out)


def matrix(
    model: str, runner: str, scratch: Path
) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, int], str]:
    """(profile -> call -> targets met, call -> targets, call -> targets the median of the
    other calls' profiles meets on it, why there is no median or "") over every stored run of
    `model` by `runner`; the merged profiles are written under `scratch`. Profiles of one
    runner but another format or kernel tiles do not merge: then there is no median."""
    runs = real_runs(model, runner)
    calls = sorted({folder_of(r) for r in runs})
    singles = call_profiles(model, runner)
    profiles = candidates(model, runner)
    without: dict[str, Path] = {}
    why_not = ""
    try:
        profiles[MEDIAN] = merged(list(singles.values()), scratch / MEDIAN)
        if len(singles) > 1:
            without = {
                call: merged(
                    [p for c, p in singles.items() if c != call], scratch / f"without_{call}"
                )
                for call in calls
            }
    except ProfileError as e:
        why_not = str(e)
    jobs = [(name, run, prof) for name, prof in profiles.items() for run in runs]
    jobs += [(None, run, without[folder_of(run)]) for run in runs if folder_of(run) in without]
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(targets_met, [(run, prof) for _, run, prof in jobs], chunksize=8))
    met: dict[str, dict[str, int]] = {name: {} for name in profiles}
    totals: dict[str, int] = {}
    median_of_others: dict[str, int] = {}
    first = next(iter(profiles))
    for (name, run, _), (m, n) in zip(jobs, results, strict=True):
        call = folder_of(run)
        if name is None:
            median_of_others[call] = median_of_others.get(call, 0) + m
            continue
        met[name][call] = met[name].get(call, 0) + m
        if name == first:
            totals[call] = totals.get(call, 0) + n
    return met, totals, median_of_others, why_not


def report(
    model: str,
    met: dict[str, dict[str, int]],
    totals: dict[str, int],
    profiles: dict[str, Path],
    median_of_others: dict[str, int] | None = None,
    why_no_median: str = "",
) -> str:
    """The matrix and the leave-one-call-out checks, in markdown (the shipped profile's column
    only where it measured the same runner as the calls). Leave one call out chooses among the
    calls' own profiles only: "shipped" and "median" may hold the held-out call's."""
    calls = sorted(totals)
    shipped = "shipped" in met
    merged_col = bool(median_of_others)
    total = sum(totals.values())
    mine = {call: made_by(profiles, call) for call in calls}
    lines = [
        f"{model}: every profile on every call's runs, targets met ({len(calls)} calls, "
        f"{total} targets).",
        "",
        "| profile | all calls | its own call's runs |",
        "| --- | ---: | ---: |",
    ]
    for name in sorted(met, key=lambda p: (-sum(met[p].values()), p)):
        own_calls = [c for c in calls if name in mine[c]]
        own_cell = " ".join(f"{met[name][c]}/{totals[c]}" for c in own_calls) or "-"
        lines.append(f"| {name} | {sum(met[name].values())} | {own_cell} |")
    lines += [
        "",
        "Leave one call out: the call profile with the most targets on the other "
        "calls' runs"
        + (", and the median of the other calls' profiles," if merged_col else ",")
        + " scored on the held-out call.",
        "",
        "| held-out call | chosen profile | its targets |"
        + (" median of the others |" if merged_col else "")
        + " own profile |"
        + (" shipped |" if shipped else ""),
        "| --- | --- | ---: |"
        + (" ---: |" if merged_col else "")
        + " ---: |"
        + (" ---: |" if shipped else ""),
    ]
    loo = own_sum = 0
    singles = [p for p in met if p not in ("shipped", MEDIAN)]
    for call in calls:
        others = [p for p in singles if p not in mine[call]]
        best = max(others, key=lambda p: (sum(v for c, v in met[p].items() if c != call), p))
        loo += met[best][call]
        own_name = min(mine[call]) if mine[call] else None
        own_met = met[own_name][call] if own_name else None
        own_sum += own_met or 0
        own_cell = f"{own_met}/{totals[call]}" if own_name else "-"
        lines.append(
            f"| {call} | {best} | {met[best][call]}/{totals[call]} |"
            + (f" {median_of_others[call]}/{totals[call]} |" if merged_col else "")
            + f" {own_cell} |"
            + (f" {met['shipped'][call]}/{totals[call]} |" if shipped else "")
        )
    merged_tail = (
        f" (the median of the other calls' profiles: {sum(median_of_others.values())} of {total})"
        if merged_col
        else ""
    )
    tail = f"; the shipped profile: {sum(met['shipped'].values())} of {total}" if shipped else ""
    lines += [
        "",
        f"Leave-one-call-out total: {loo} of {total}{merged_tail}; each call's own "
        f"profile: {own_sum} of {total}{tail}.",
    ]
    if why_no_median:
        lines += ["", f"No median of the calls' profiles: {why_no_median}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", help="stem of the markdown and CSV outputs (default: print only)")
    ap.add_argument(
        "--runner",
        choices=tuple(RUNNERS),
        help="the runner whose calls and profiles to compare (default: the one the "
        "shipped profile measured)",
    )
    args = ap.parse_args()
    runner = RUNNERS[args.runner] if args.runner else shipped_runner(args.model)
    if runner is None or not real_runs(args.model, runner):
        raise SystemExit(
            f"no stored real runs of {args.model!r} by runner {runner!r} under {RESULTS}"
        )
    with tempfile.TemporaryDirectory() as scratch:
        met, totals, median_of_others, why_not = matrix(args.model, runner, Path(scratch))
    text = report(
        args.model, met, totals, candidates(args.model, runner), median_of_others, why_not
    )
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
