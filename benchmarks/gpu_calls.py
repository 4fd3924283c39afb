"""The GPU calls stored under results/validation, and which runner each one measured.

A call folder holds the real runs served in one GPU call (`real/<model>/`) and the profile
calibrated in it (`profile/h200/<model>/`); a shipped profile in `calibration/h200/` is the
median of several calls' profiles (`pagesim merge-profiles`), or a copy of one call's. A
profile prices the runner it was measured with, since the runner's host work is part of every
step it timed, so the benchmarks that price one call's runs with another call's profile
compare calls of one runner only. The runner is read from each profile's metadata
(`pagesim.gpu.modes`), not from a hand-kept list of folder names.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import cache
from pathlib import Path

from pagesim.cost.profile import Profile
from pagesim.gpu.modes import RUNNER_LABELS, RUNNER_MODES, profile_runner, runner_label
from pagesim.validate import real_run_files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "validation"
SHIPPED = ROOT / "calibration" / "h200"
#: The runner whose graph steps keep block-table rows across steps and stage their inputs in
#: one pinned buffer (`pagesim.gpu.input_buffers`).
STAGED_RUNNER = RUNNER_LABELS[RUNNER_MODES[True]]
#: The graph runner before it, which rebuilt every step's inputs.
REBUILT_RUNNER = "CUDA graphs, inputs rebuilt each step"
#: The runner without CUDA graphs.
EAGER_RUNNER = RUNNER_LABELS[RUNNER_MODES[False]]
#: Calls whose calibration was cut short: the calls made after the median profiles were
#: shipped spent 30 s on their grid (block 16 only). Their runs hold the shipped profiles out;
#: their partial profiles price nothing, and are neither compared nor merged.
PARTIAL = {"staged_holdout", "staged_holdout2"}
#: Calls that served their Poisson runs two or three times over (`gpu_session.py --passes`),
#: after the median profiles were shipped: their runs hold the shipped profiles out and are
#: reported by repeat group (`pagesim validate`). The cross-call comparisons, which take one
#: run of each load per call, leave them out; `staged_passes` also calibrated for 30 s only.
REPEATED = {"staged_passes", "staged_passes2"}
#: Calls left out of every cross-call comparison: the call that served two models at once on
#: one host (its host time was not its own), `PARTIAL` and `REPEATED`. Calls of other runner
#: modes (no graphs, decode graphs only, TP) fall out by their runner.
SKIP = {"two_at_once", "tp2", "tp2_graphs", *PARTIAL, *REPEATED}


def folder_of(run: Path) -> str:
    """A stored run's call: the folder that holds its `real/<model>/`."""
    return run.parents[2].name


def profile_of(call: str, model: str) -> Path | None:
    """The profile a call measured for `model`, if any."""
    prof = RESULTS / call / "profile" / "h200" / model
    return prof if (prof / "profile.json").is_file() else None


def profile_runner_label(profile: Path) -> str | None:
    """The short name of the runner mode a profile folder names, if it names one."""
    mode = profile_runner(Profile.load_metadata(profile).attention_backend)
    return None if mode is None else runner_label(mode)


@cache
def runner_of(call: str, model: str) -> str | None:
    """The runner a call's profile of `model` measured, if the call has one."""
    prof = profile_of(call, model)
    return None if prof is None else profile_runner_label(prof)


def shipped_runner(model: str) -> str | None:
    """The runner the shipped profile of `model` measured."""
    return profile_runner_label(SHIPPED / model)


def call_runs(
    model: str, runner: str | Callable[[str | None], bool], skip: Collection[str] = SKIP
) -> list[tuple[str, Path]]:
    """(call, run folder) of every stored call of `model` by `runner` (a name, or a test of
    the name)."""
    keep = runner if callable(runner) else (lambda r: r == runner)
    folders = [(d.parents[1].name, d) for d in sorted(RESULTS.glob(f"*/real/{model}"))]
    return [(call, d) for call, d in folders if call not in skip and keep(runner_of(call, model))]


def real_runs(model: str, runner: str) -> list[Path]:
    """Every stored real run of `model` served by `runner`."""
    return [f for _, d in call_runs(model, runner) for f in real_run_files(d)]


def call_profiles(model: str, runner: str) -> dict[str, Path]:
    """Every call's own profile of `model` measured with `runner`, by call (runs or not)."""
    out = {}
    for prof in sorted(RESULTS.glob(f"*/profile/h200/{model}")):
        call = prof.parents[2].name
        if call not in SKIP and runner_of(call, model) == runner:
            out[call] = prof
    return out
