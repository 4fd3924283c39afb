"""Parameter sweeps: one simulation per grid point and seed, laid out as `vllm bench sweep`.

    results/<YYYYmmdd_HHMMSS>/
        sweep.json                     the grid (points and their settings), for --resume
        <point>/run=0.json ...         vllm bench serve's JSON keys + pagesim's, per run
        <point>/run=N.failed.json      a run that failed: its settings and the error
        <point>/run=N.{requests,steps}.parquet   with save_records
        summary.csv, summary.parquet   one row per run: every setting and metric

Run N of a point uses seed `seed + N`. Each run is a pure function of its task (config, load,
seed), so the files are the same whichever backend ran it and in whatever order runs
finished; the JSON's `date` is the sweep's timestamp, so re-running a sweep into the same
directory writes the same bytes. A run that raises becomes a failed run (reported with its
settings); the sweep goes on. `resume` skips runs whose JSON already exists and re-runs
failed ones; the grid must be the one stored in sweep.json.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.planning.backends import BACKENDS, execute
from pagesim.planning.grid import SweepGrid, SweepPoint
from pagesim.planning.mix import workload_ref
from pagesim.planning.summary import metrics_row, settings_row, summary_frame
from pagesim.sim.build import (
    cost_model_label,
    default_profile,
    pricing_profile,
    profile_record,
    scaled_cost_model,
)
from pagesim.sim.output import requests_table, result_json, steps_table, write_parquet_atomic
from pagesim.sim.simulate import LoadSpec, result_metadata, simulate
from pagesim.utils import atomic_write_text

MANIFEST = "sweep.json"


@dataclass(frozen=True)
class RunTask:
    """One simulation of a sweep: everything a worker needs (picklable)."""

    point: SweepPoint
    run: int
    config: EngineConfig
    load: LoadSpec  # seed already offset by `run`
    profile: str | None  # calibration directory; None: the transfer or the analytical model
    date: str
    save_records: bool = False
    transfer: bool = True  # no profile: price by transfer where a source ships (as `run`)


@dataclass(frozen=True)
class RunOutcome:
    document: str | None  # the run's JSON text; None if it failed
    error: str | None  # "ErrorType: message" (first line) if it failed
    tables: tuple | None = None  # (requests, steps) pyarrow tables with save_records


class SweepInterrupted(Exception):
    """Ctrl-C or SIGTERM during a sweep: the runs written so far are kept for --resume."""

    def __init__(self, directory: Path, num_done: int, num_runs: int) -> None:
        super().__init__(f"interrupted: {num_done} of {num_runs} runs done in {directory}")
        self.directory, self.num_done, self.num_runs = directory, num_done, num_runs


@dataclass(frozen=True)
class SweepResult:
    directory: Path
    summary: pd.DataFrame  # one row per run, in point and run order
    failures: tuple[dict[str, Any], ...]  # point, run, settings, error
    num_skipped: int  # runs found done when resuming


def run_one(task: RunTask) -> RunOutcome:
    """Simulate one task; any exception becomes a failed outcome, never a crash."""
    try:
        cost = scaled_cost_model(task.config, task.profile, 1.0, task.transfer)
        with workload_ref(task.load.workload) as ref:
            sim = simulate(
                task.config,
                dataclasses.replace(task.load, workload=ref),
                profile=task.profile,
                cost_model=cost,
            )
        metadata = result_metadata(task.config, task.load)
        priced_by = pricing_profile(task.config, task.profile, task.transfer)
        metadata.update(
            cost_model=cost_model_label(task.config, task.profile, task.transfer),
            profile=profile_record(priced_by),
            sweep_point=task.point.name,
            run=task.run,
            sweep_params=task.point.settings,
        )
        document = result_json(sim.result, metadata, date=task.date)
        tables = (
            (requests_table(sim.metrics), steps_table(sim.metrics)) if task.save_records else None
        )
        return RunOutcome(document, None, tables)
    except Exception as exc:  # noqa: BLE001 - a failed point must not end the sweep
        message = (str(exc).strip().splitlines() or [""])[0]
        return RunOutcome(None, f"{type(exc).__name__}: {message}")


def make_tasks(
    grid: SweepGrid,
    num_runs: int,
    date: str,
    *,
    save_records: bool = False,
    percentiles: tuple[float, ...] = (99,),
    goodput_slos_ms: tuple[tuple[str, float], ...] = (),
) -> list[RunTask]:
    """Tasks in point order, then run order."""
    if num_runs < 1:
        raise ConfigError(f"--num-runs {num_runs}: must be >= 1")
    tasks = []
    for point in grid.points:
        config = point.engine_config()
        load = point.load_spec(percentiles, goodput_slos_ms)
        profile = resolve_profile(point.profile, config)
        transfer = not is_analytical(point.profile)
        for run in range(num_runs):
            seeded = dataclasses.replace(load, seed=load.seed + run)
            tasks.append(RunTask(point, run, config, seeded, profile, date, save_records, transfer))
    return tasks


def is_analytical(given: str | None) -> bool:
    """Whether a point's `profile` asks for the analytical model by name."""
    return given is not None and given.lower() == "analytical"


def resolve_profile(given: str | None, config: EngineConfig) -> str | None:
    """`analytical` -> None; None -> the shipped profile for the config, if any (a GPU with none
    is priced by transfer, `RunTask.transfer`); else as given."""
    if is_analytical(given):
        return None
    if given is None:
        found = default_profile(config)
        return str(found) if found else None
    return given


def run_file(directory: Path, task: RunTask, suffix: str = ".json") -> Path:
    return directory / task.point.name / f"run={task.run}{suffix}"


def run_sweep(
    grid: SweepGrid,
    *,
    num_runs: int = 1,
    output_dir: Path | str = "results",
    timestamp: str | None = None,
    resume: Path | str | None = None,
    backend: str = "local",
    n_jobs: int | None = None,
    address: str | None = None,
    save_records: bool = False,
    percentiles: tuple[float, ...] = (99,),
    goodput_slos_ms: tuple[tuple[str, float], ...] = (),
    progress: bool = False,
) -> SweepResult:
    """Run every point `num_runs` times; write the layout above; return the summary."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    directory, date = _open_directory(grid, num_runs, Path(output_dir), timestamp, resume)
    tasks = make_tasks(
        grid,
        num_runs,
        date,
        save_records=save_records,
        percentiles=percentiles,
        goodput_slos_ms=goodput_slos_ms,
    )
    todo = [t for t in tasks if not is_done(run_file(directory, t))]
    skipped = len(tasks) - len(todo)
    outcomes = execute(run_one, todo, backend=backend, n_jobs=n_jobs, address=address)
    done = 0
    try:
        with _Progress(len(grid), tasks, todo, enabled=progress) as bar:
            for i, outcome in outcomes:
                _write_outcome(directory, todo[i], outcome)
                bar.advance(todo[i])
                done += 1
    except KeyboardInterrupt:
        raise SweepInterrupted(directory, skipped + done, len(tasks)) from None
    summary = summary_frame(directory, tasks)
    summary.to_csv(directory / "summary.csv", index=False)
    summary.to_parquet(directory / "summary.parquet", index=False)
    failures = tuple(
        {"point": t.point.name, "run": t.run, "settings": t.point.settings, "error": e}
        for t, e in zip(tasks, summary["error"], strict=True)
        if isinstance(e, str)
    )
    return SweepResult(directory, summary, failures, skipped)


def _open_directory(
    grid: SweepGrid,
    num_runs: int,
    output_dir: Path,
    timestamp: str | None,
    resume: Path | str | None,
) -> tuple[Path, str]:
    manifest = {
        "points": [{"name": p.name, "settings": p.settings} for p in grid.points],
        "varying": list(grid.varying),
    }
    text = json.dumps(manifest, indent=1, default=str, allow_nan=True)
    if resume is not None:
        directory = Path(resume)
        if not directory.is_dir() and not Path(resume).is_absolute():
            directory = output_dir / str(resume)
        stored_path = directory / MANIFEST
        if not stored_path.is_file():
            raise ConfigError(f"--resume {resume}: no {MANIFEST} in {directory}")
        stored = _read_manifest(stored_path, resume)
        if stored.get("points") != json.loads(text)["points"]:
            raise ConfigError(
                f"--resume {resume}: the grid differs from the one in "
                f"{stored_path}; give the same settings"
            )
        if num_runs > stored.get("num_runs", 0):  # more seeds per point than before
            stored["num_runs"] = num_runs
            atomic_write_text(stored_path, json.dumps(stored, indent=1) + "\n")
        return directory, stored["timestamp"]
    date = timestamp or datetime.now().strftime("%Y%m%d_%H%M%S")
    directory = output_dir / date
    if (directory / MANIFEST).exists():
        raise ConfigError(f"{directory} already holds a sweep; use --resume {date}")
    directory.mkdir(parents=True, exist_ok=True)
    doc = {"timestamp": date, "num_runs": num_runs, **json.loads(text)}
    atomic_write_text(directory / MANIFEST, json.dumps(doc, indent=1) + "\n")
    return directory, date


def _read_manifest(path: Path, resume: Path | str) -> dict[str, Any]:
    """A stored sweep.json, or a one-line error saying why it cannot be resumed from."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else type(exc).__name__
        raise ConfigError(f"--resume {resume}: {path} is unreadable ({why})") from None
    ok = (
        isinstance(stored, dict)
        and isinstance(stored.get("points"), list)
        and isinstance(stored.get("timestamp"), str)
        and isinstance(stored.get("num_runs", 0), int)
    )
    if not ok:
        raise ConfigError(
            f"--resume {resume}: {path} is not a sweep manifest (needs points, timestamp)"
        )
    return stored


def is_done(path: Path) -> bool:
    """A run whose JSON exists and parses (a torn or corrupted file is run again)."""
    try:
        return isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def _write_outcome(directory: Path, task: RunTask, outcome: RunOutcome) -> None:
    path = run_file(directory, task)
    failed = run_file(directory, task, ".failed.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    if outcome.document is None:
        doc = {
            "point": task.point.name,
            "run": task.run,
            "seed": task.load.seed,
            "settings": task.point.settings,
            "error": outcome.error,
        }
        atomic_write_text(failed, json.dumps(doc, indent=2, default=str) + "\n")
        return
    atomic_write_text(path, outcome.document)
    failed.unlink(missing_ok=True)
    if outcome.tables is not None:
        for table, kind in zip(outcome.tables, ("requests", "steps"), strict=True):
            write_parquet_atomic(table, run_file(directory, task, f".{kind}.parquet"))


class _Progress:
    """A rich bar over runs, titled with points done; silent when disabled."""

    def __init__(
        self, num_points: int, tasks: list[RunTask], todo: list[RunTask], enabled: bool
    ) -> None:
        self.enabled, self.num_points = enabled, num_points
        self.left = Counter(t.point.name for t in todo)
        self.points_done = num_points - len(self.left)
        self.total, self.done = len(tasks), len(tasks) - len(todo)
        self.bar: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("runs"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self.bar.start()
            self.task = self.bar.add_task(self._title(), total=self.total, completed=self.done)
        return self

    def _title(self) -> str:
        return f"points {self.points_done}/{self.num_points}"

    def advance(self, task: RunTask) -> None:
        self.left[task.point.name] -= 1
        if self.left[task.point.name] == 0:
            self.points_done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=self._title())

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def run_grid(
    grid: SweepGrid,
    *,
    num_runs: int = 1,
    n_jobs: int | None = 1,
    backend: str = "local",
    percentiles: tuple[float, ...] = (99,),
    goodput_slos_ms: tuple[tuple[str, float], ...] = (),
) -> pd.DataFrame:
    """The summary of a sweep run in memory, writing nothing (notebooks, tests)."""
    tasks = make_tasks(
        grid, num_runs, "in-memory", percentiles=percentiles, goodput_slos_ms=goodput_slos_ms
    )
    outcomes: dict[int, RunOutcome] = dict(execute(run_one, tasks, backend=backend, n_jobs=n_jobs))
    rows = []
    for i, task in enumerate(tasks):
        row = settings_row(task)
        outcome = outcomes[i]
        if outcome.document is None:
            row.update(status="failed", error=outcome.error)
        else:
            row.update(metrics_row(json.loads(outcome.document)))
        rows.append(row)
    return pd.DataFrame.from_records(rows)
