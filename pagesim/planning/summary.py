"""The tidy summary of a sweep: one row per run, every setting and every metric.

Columns, in order: `point`, `run`, `status` (ok | failed), `error`; the resolved engine
config (every EngineConfig field), `cost_model` (calibrated | transfer | analytical) and
`profile` (the one whose measurements priced the run: for a transfer, its source); the load
(`workload`, `num_prompts`, `request_rate`, ...); then the run's metrics (vllm bench's keys,
then pagesim's). Lists and mappings in a result (rejected reasons) are JSON text; "inf"
becomes a float. A failed run has its settings and error and no metrics.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from pagesim.errors import ConfigError
from pagesim.sim.build import cost_model_label, pricing_profile, profile_path
from pagesim.sim.simulate import METADATA_LOAD_KEYS
from pagesim.workload import WORKLOAD_PARAMS

# Run metadata written before the metrics; its settings already have columns of their own.
METADATA_KEYS = frozenset(
    {
        "date",
        "backend",
        "model_id",
        "gpu",
        *METADATA_LOAD_KEYS,
        "cost_model",
        "profile",
        "sweep_point",
        "run",
        "sweep_params",
        "engine_config",
    }
)
LOAD_COLUMNS = (*METADATA_LOAD_KEYS, *WORKLOAD_PARAMS)


def settings_row(task: Any) -> dict[str, Any]:
    """Point, run and every resolved setting of a `RunTask`."""
    row: dict[str, Any] = {"point": task.point.name, "run": task.run, "status": "ok", "error": None}
    row.update(dataclasses.asdict(task.config))
    row["cost_model"] = cost_model_label(task.config, task.profile, task.transfer)
    priced_by = pricing_profile(task.config, task.profile, task.transfer)  # a transfer's source
    row["profile"] = profile_path(priced_by) if priced_by else "analytical"
    for key in LOAD_COLUMNS:  # request_rate None: the workload's own arrivals
        row[key] = getattr(task.load, key)
    return row


def _scalar(value: Any) -> Any:
    if isinstance(value, list | dict):
        return json.dumps(value, sort_keys=True)
    if value == "inf":
        return math.inf
    return value


def metrics_row(document: dict[str, Any]) -> dict[str, Any]:
    return {k: _scalar(v) for k, v in document.items() if k not in METADATA_KEYS}


def summary_frame(directory: Path, tasks: list[Any]) -> pd.DataFrame:
    """Rows for `tasks` (point then run order) from the run files in `directory`."""
    rows = []
    for task in tasks:
        row = settings_row(task)
        base = Path(directory) / task.point.name
        done, failed = base / f"run={task.run}.json", base / f"run={task.run}.failed.json"
        if done.is_file():
            row.update(metrics_row(json.loads(done.read_text())))
        elif failed.is_file():
            row["status"] = "failed"
            row["error"] = json.loads(failed.read_text())["error"]
        else:
            row["status"] = "missing"
        rows.append(row)
    return pd.DataFrame.from_records(rows)


def read_summary(directory: Path | str) -> pd.DataFrame:
    """A sweep's summary (Parquet if present, else CSV)."""
    d = Path(directory)
    for name, read in (("summary.parquet", pd.read_parquet), ("summary.csv", pd.read_csv)):
        if (d / name).is_file():
            try:
                df = read(d / name)
            except (ValueError, UnicodeDecodeError, OSError) as exc:
                raise ConfigError(f"{d / name}: unreadable ({type(exc).__name__})") from None
            if df.empty:
                raise ConfigError(f"{d / name}: no runs in the summary")
            return df
    raise ConfigError(f"{d}: no summary.csv or summary.parquet (not a sweep directory)")
