"""The prediction against the real run: error per metric in % of the real value, per run and
over the repeats of one traffic (their mean, beside their own spread)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import ConfigError
from pagesim.metrics.report import HEADLINE_METRICS
from pagesim.sim.build import cost_model_line, pricing_profile, scaled_cost_model
from pagesim.sim.simulate import SimulationResult, simulate
from pagesim.validate.store import jsonable, load_spec, read_real_run, real_run_config

#: metric -> target |error| in %, as the validation issue states them.
TARGETS_PCT: dict[str, float] = {
    "request_throughput": 3.0,
    "output_throughput": 3.0,
    "mean_ttft_ms": 5.0,
    "median_ttft_ms": 10.0,
    "p99_ttft_ms": 10.0,
    "mean_tpot_ms": 3.0,
    "median_tpot_ms": 10.0,
    "p99_tpot_ms": 10.0,
    "mean_itl_ms": 10.0,
    "median_itl_ms": 10.0,
    "p99_itl_ms": 10.0,
    "mean_e2el_ms": 3.0,
    "median_e2el_ms": 10.0,
    "p99_e2el_ms": 10.0,
}
#: metric -> target |error| in % for a load served two or more times, against the mean of its
#: real runs: identical real runs differ by a few % from one another, so the mean is what a
#: prediction of the expected run can meet. The metrics of `SPREAD_WIDENED` are held to the
#: larger of this and half the repeats' own spread (max - min, % of the mean).
REPEAT_TARGETS_PCT: dict[str, float] = {
    "request_throughput": 3.0,
    "output_throughput": 3.0,
    "mean_ttft_ms": 5.0,
    "p99_ttft_ms": 10.0,
    "mean_tpot_ms": 3.0,
    "p99_tpot_ms": 10.0,
    "mean_e2el_ms": 3.0,
    "p99_e2el_ms": 10.0,
}
SPREAD_WIDENED: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "mean_tpot_ms",
    "mean_e2el_ms",
)
SUMMARY_METRICS: tuple[str, ...] = (
    *HEADLINE_METRICS,
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
)


def compare(
    real: dict[str, Any], predicted: dict[str, Any], targets: dict[str, float] = TARGETS_PCT
) -> list[dict[str, Any]]:
    """Per metric: real, predicted, error in % of real, target and whether it is met."""
    rows = []
    for key, target in targets.items():
        r, p = real.get(key), predicted.get(key)
        if r is None or p is None:
            continue
        err = 100.0 * (p - r) / r if r else (0.0 if p == r else math.inf)
        rows.append(
            {
                "metric": key,
                "real": r,
                "predicted": p,
                "error_pct": err,
                "target_pct": target,
                "met": abs(err) <= target,
            }
        )
    return rows


def simulate_like(
    real_doc: dict[str, Any], profile: str | Path | None, cost_model: CostModel | None = None
) -> SimulationResult:
    """`simulate` with the real run's engine config (its measured KV blocks) and load;
    `cost_model` (optional) prices the steps in place of `profile`'s model."""
    config, load = real_run_config(real_doc), load_spec(real_doc["load"])
    return simulate(config, load, profile=profile, cost_model=cost_model)


class TruncatedRunError(ConfigError):
    """A real run cut at its wall-clock limit: its metrics cover the requests that finished
    in time, a prediction covers them all, so the two do not compare."""


def traffic_key(doc: dict[str, Any], profile: str | Path | None) -> str:
    """What the prediction of a stored run depends on: its engine config (with the KV blocks
    the GPU measured), its load and the profile. Runs with one key are repeats of one run: the
    simulator, deterministic, predicts them alike, and their real values scatter."""
    cfg = {f.name: getattr(real_run_config(doc), f.name) for f in fields(EngineConfig)}
    text = json.dumps(
        {"engine": cfg, "load": doc["load"], "profile": None if profile is None else str(profile)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def validate_real_run(
    real_path: str | Path,
    profile: str | Path | None,
    predictions: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Simulate the traffic of a stored real run and compare; returns the report entry.
    Raises `TruncatedRunError` for a run cut at its wall-clock limit.

    `predictions` (optional), a dict kept across calls, holds each traffic's predicted result
    (`traffic_key`): repeats of one run are simulated once."""
    doc = read_real_run(real_path)
    if doc["result"].get("truncated"):
        raise TruncatedRunError(
            f"real run {str(real_path)!r} was cut at its wall-clock limit "
            f"({doc['result'].get('completed')} of {doc['load']['num_prompts']} requests "
            "finished): not compared"
        )
    # priced as `pagesim run` prices the run's config: by `profile`, else by transfer of the
    # source GPU's shipped profile where one exists, else by the analytical model
    config = real_run_config(doc)
    priced_by = pricing_profile(config, profile, transfer=True)
    key = traffic_key(doc, profile)
    predicted = None if predictions is None else predictions.get(key)
    if predicted is None:
        cost = scaled_cost_model(config, profile, 1.0, transfer=True)
        predicted = simulate_like(doc, profile, cost).result
        if predictions is not None:
            predictions[key] = predicted
    cfg = doc["engine_config"]
    entry = {
        "run": Path(real_path).name.split(".")[0],
        "model": cfg["model"],
        "block_size": cfg["block_size"],
        "load": doc["load"],
        "num_gpu_blocks": doc["result"]["num_gpu_blocks"],
        "profile": str(priced_by) if priced_by is not None else None,
        "cost_model": cost_model_line(config, profile),
        "traffic": key,
        "rows": compare(doc["result"], predicted),
        "real": jsonable(doc["result"]),
        "predicted": jsonable(predicted),
        "device": doc.get("device", {}),
    }
    note = runner_mismatch(doc["result"].get("gpu_runner"), priced_by)
    if note:
        entry["runner_note"] = note
    return entry


def runner_mismatch(run_runner: str | None, profile: str | Path | None) -> str | None:
    """Why a profile may misprice a run: it was measured with another runner mode (whose
    host work per step differs), or None when both name the same mode or either names none
    (runs stored before they named theirs; the analytical model)."""
    if not run_runner or profile is None:
        return None
    from pagesim.cost.profile import Profile
    from pagesim.gpu.modes import profile_runner, runner_label

    measured = profile_runner(Profile.load_metadata(profile).attention_backend)
    if measured is None or measured == run_runner:
        return None
    return (
        f"the run's runner ({runner_label(run_runner)}) is not the one the profile "
        f"measured ({runner_label(measured)}): its host time per step differs"
    )


def base_run_name(run: str) -> str:
    """A run's name without its repeat suffix (`chat-85pct-bs16-r2`: chat-85pct-bs16 again)."""
    return re.sub(r"-r\d+$", "", run)


def repeat_groups(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The repeats among `entries` (two or more runs of one traffic key), each compared as one:
    the prediction against the mean of the real runs, beside the real runs' own spread.

    A single real run carries the GPU's speed at that moment: identical runs minutes apart
    differ by several % at high load, where queueing amplifies a step-time difference. The
    simulator predicts the expected run, so the mean of repeats is what it should meet; the
    spread (max - min, % of the mean) says how far apart the real side itself is."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_key.setdefault(e.get("traffic", e["run"]), []).append(e)
    groups = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        members = sorted(members, key=lambda e: e["run"])  # the same report in any order
        real_mean, spread = {}, {}
        for metric in REPEAT_TARGETS_PCT:
            values = [e["real"].get(metric) for e in members]
            if any(v is None for v in values):
                continue
            real_mean[metric] = sum(values) / len(values)
            spread[metric] = (
                100.0 * (max(values) - min(values)) / real_mean[metric]
                if real_mean[metric]
                else 0.0
            )
        rows = compare(real_mean, members[0]["predicted"], repeat_targets(spread))
        for row in rows:
            row["real_spread_pct"] = spread[row["metric"]]
            row["runs_met"] = sum(
                r["met"] for e in members for r in e["rows"] if r["metric"] == row["metric"]
            )
        first = members[0]
        groups.append(
            {
                "run": base_run_name(first["run"]),
                "runs": [e["run"] for e in members],
                "model": first["model"],
                "block_size": first["block_size"],
                "load": first["load"],
                "rows": rows,
            }
        )
    return groups


def repeat_targets(spread_pct: dict[str, float]) -> dict[str, float]:
    """The targets (|error| in %) of a load's repeats whose real runs spread `spread_pct`
    (metric -> max - min in % of their mean): `REPEAT_TARGETS_PCT`, the `SPREAD_WIDENED`
    metrics widened to half their spread. Metrics without a spread are not checked."""
    return {
        m: max(t, spread_pct[m] / 2.0) if m in SPREAD_WIDENED else t
        for m, t in REPEAT_TARGETS_PCT.items()
        if m in spread_pct
    }
