"""Contiguous allocation versus paging on the same traffic and the same KV memory.

The vLLM paper's argument in numbers: each policy (`reserve-max`, `pow2`, `oracle` regions
placed by a real allocator, and `paged` blocks) serves one load over one KV budget; the
accountant splits KV memory, time-weighted, four ways (token states, reserved, internal
fragmentation, external fragmentation and others) plus free. How many more requests fit is
read from the running batch: the mean and peak number of running requests at the same memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.config import EngineConfig
from pagesim.metrics import MetricsCollector
from pagesim.metrics.report import HEADLINE_METRICS
from pagesim.sim.simulate import LoadSpec, simulate

POLICIES: tuple[str, ...] = ("reserve-max", "pow2", "oracle", "paged")
WASTE_COLUMNS: tuple[str, ...] = (
    "kv_token_state_frac",
    "kv_reserved_frac",
    "kv_internal_frag_frac",
    "kv_external_frag_frac",
)
WASTE_LABELS: dict[str, str] = {
    "kv_token_state_frac": "Token states",
    "kv_reserved_frac": "Reservation",
    "kv_internal_frag_frac": "Internal fragmentation",
    "kv_external_frag_frac": "External fragmentation & others",
    "kv_free_frac": "Free",
}
TABLE_KEYS: tuple[str, ...] = (
    *WASTE_COLUMNS,
    "kv_free_frac",
    "kv_cache_usage_mean",
    "mean_num_running",
    "max_num_running",
    *HEADLINE_METRICS,
    "mean_e2el_ms",
    "num_preemptions",
    "num_rejected",
    "completed",
)


@dataclass(frozen=True)
class AllocatorComparison:
    """One run per policy: `table` has a row per policy, `timelines` the per-step split."""

    table: pd.DataFrame  # index: allocator; columns: TABLE_KEYS
    timelines: dict[str, pd.DataFrame]  # allocator -> waste_timeline(...)
    config: EngineConfig
    load: LoadSpec


def waste_timeline(metrics: MetricsCollector) -> pd.DataFrame:
    """Per-step KV split over time: `time_s` (step start) and the four fractions plus free.

    Fractions are of the usable KV memory and sum to 1 with `kv_free_frac`."""
    cols = ("start_time_s", *WASTE_COLUMNS)
    steps = pd.DataFrame({c: np.frombuffer(metrics.steps[c], dtype=np.float64) for c in cols})
    return waste_timeline_from_steps(steps)


def waste_timeline_from_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The same from a per-step table (`run=N.steps.parquet` of a sweep with records)."""
    frame = pd.DataFrame(
        {
            "time_s": steps["start_time_s"].to_numpy(dtype=np.float64),
            **{c: steps[c].to_numpy(dtype=np.float64) for c in WASTE_COLUMNS},
        }
    )
    frame["kv_free_frac"] = (1.0 - frame[list(WASTE_COLUMNS)].sum(axis=1)).clip(lower=0.0)
    return frame


def compare_allocators(
    config: EngineConfig, load: LoadSpec, *, profile: str | Path | None = None
) -> AllocatorComparison:
    """Run `load` under every policy with `config`'s KV memory; compare waste and speed."""
    rows, timelines = {}, {}
    for policy in POLICIES:
        sim = simulate(config.replace(allocator=policy), load, profile=profile)
        rows[policy] = {k: sim.result.get(k) for k in TABLE_KEYS}
        timelines[policy] = waste_timeline(sim.metrics)
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "allocator"
    return AllocatorComparison(table, timelines, config, load)


def fit_gain(table: pd.DataFrame) -> pd.Series:
    """How many times more requests run at once under paged blocks than under each policy."""
    return table.loc["paged", "mean_num_running"] / table["mean_num_running"].astype(float)


def saturated_throughput(
    config: EngineConfig, load: LoadSpec, *, profile: str | Path | None = None
) -> float:
    """Requests per second `config` completes with every request of `load` sent at t=0: the
    capacity that realistic loads are a share of."""
    run = simulate(config, replace(load, request_rate=math.inf), profile=profile)
    return float(run.result["request_throughput"])


def compare_at_loads(
    config: EngineConfig,
    load: LoadSpec,
    shares: tuple[float, ...] = (0.7, 0.9),
    *,
    profile: str | Path | None = None,
) -> tuple[pd.DataFrame, float]:
    """`compare_allocators` at each share of the paged engine's capacity (Poisson arrivals
    at share x `saturated_throughput` of `config` with paged blocks): where users operate,
    rather than saturated. Returns (table indexed by (load, allocator), capacity in req/s)."""
    capacity = saturated_throughput(config.replace(allocator="paged"), load, profile=profile)
    tables = []
    for share in shares:
        at = replace(load, request_rate=round(share * capacity, 3))
        table = compare_allocators(config, at, profile=profile).table
        table.insert(0, "request_rate", at.request_rate)
        tables.append(table.assign(load=f"{100 * share:.0f}% of capacity"))
    both = pd.concat(tables).reset_index().set_index(["load", "allocator"])
    return both, capacity
