"""A run's band: the headline metrics simulated again at the ends of the step-time band.

`pagesim run` prices the run as the profile measured it, then every step at the smallest and
the largest level the profile's sources were measured at (`pagesim.cost.level_band`), and
reports each headline metric's range over the three runs. Two more simulations of the same
requests: the range is what the GPU's session-to-session speed does to this answer, not a
confidence interval of the simulation (which is deterministic for a seed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pagesim.cost.level_band import StepTimeBand, range_text
from pagesim.metrics.report import LATENCY_METRICS

#: result key -> label, the figures a band is reported for (as vllm bench labels them)
HEADLINE = {
    "request_throughput": "Request throughput (req/s)",
    "output_throughput": "Output token throughput (tok/s)",
    "mean_ttft_ms": "Mean TTFT (ms)",
    "p99_ttft_ms": "P99 TTFT (ms)",
    "mean_tpot_ms": "Mean TPOT (ms)",
    "p99_tpot_ms": "P99 TPOT (ms)",
    "mean_e2el_ms": "Mean E2EL (ms)",
    "p99_e2el_ms": "P99 E2EL (ms)",
}


def metric_band(
    center: dict[str, Any], simulate_at: Callable[[float], dict[str, Any]], band: StepTimeBand
) -> dict[str, Any]:
    """The band's record: its factors and basis, and [low, high] of each headline metric over
    the run at the center and the runs at the band's two ends (`simulate_at(factor)` returns
    a run's result)."""
    ends = [simulate_at(band.low), simulate_at(band.high)]
    metrics: dict[str, list[float]] = {}
    for key in HEADLINE:
        got = [r.get(key) for r in (center, *ends)]
        values = [float(v) for v in got if isinstance(v, int | float)]
        if len(values) == len(got):
            metrics[key] = [min(values), max(values)]
    return {**band.to_json(), "metrics": metrics}


def format_band(
    center: dict[str, Any], record: dict[str, Any], shown: Iterable[str] = LATENCY_METRICS
) -> str:
    """The printed block: one line per headline metric, `center (low-high)`, the latency
    ones only for the sections `shown` (vllm bench's --percentile-metrics)."""
    lines = [
        f"Band across {record['basis']}, every step x {record['low']:.3f}-{record['high']:.3f}:"
    ]
    sections = set(shown)
    for key, (low, high) in record["metrics"].items():
        section = key.split("_")[1]
        if key.endswith("_ms") and section not in sections:
            continue
        lines.append(f"  {HEADLINE[key] + ':':<39}{range_text(center[key], low, high)}")
    return "\n".join(lines)
