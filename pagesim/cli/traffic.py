"""What a run's traffic really is, said before and after it runs: which arrival process times
it, and how a replayed trace covers `--num-prompts` (its rows, and how many laps).

A trace shorter than `--num-prompts` wraps around (`pagesim.workload.build`); left unsaid, a
200-row trace silently becomes five laps of itself. So `pagesim run` defaults `--num-prompts`
for a trace to its own length (at most the usual 1000), and says how the trace was covered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pagesim.workload import load_workload


@dataclass(frozen=True)
class Traffic:
    """The arrival process a load uses and, for a trace replay, the trace's length."""

    arrival: str  # "trace", "poisson", "gamma" or "inf": what times the requests
    rate: float | None  # req/s of a rate-driven process; None for trace and inf
    trace_rows: int | None  # rows of a replayed trace; None for anything else


def traffic_of(values: dict[str, Any]) -> Traffic:
    """The traffic of the merged `run` settings `values` (the workload is read, not sampled)."""
    spec = load_workload(values["workload"], time_scale=values.get("time_scale")).spec
    rows = spec.trace.num_rows if spec.trace is not None and not spec.mix else None
    rate = values.get("request_rate")
    if isinstance(rate, str):
        rate = math.inf if rate.strip().lower() == "inf" else float(rate)
    if rate is not None:
        return Traffic("inf" if math.isinf(rate) else "rate", rate, rows)
    own = spec.arrival
    return Traffic(own.process, own.rate if own.process in ("poisson", "gamma") else None, rows)


def default_num_prompts(traffic: Traffic, default: int) -> int:
    """`--num-prompts` when not given: a trace's own length, capped at `default`."""
    return default if traffic.trace_rows is None else min(traffic.trace_rows, default)


def trace_note(traffic: Traffic, num_prompts: int, defaulted: bool) -> str | None:
    """One line on how the trace covers `num_prompts` requests; None for no trace."""
    rows = traffic.trace_rows
    if rows is None:
        return None
    if num_prompts > rows:
        laps = math.ceil(num_prompts / rows)
        return (
            f"Trace of {rows} rows replayed {laps} times to send {num_prompts} prompts "
            f"(laps 2-{laps} shifted in time, with fresh content)"
        )
    if not defaulted:
        return None
    if num_prompts == rows:
        return f"--num-prompts not given: replaying the trace's {rows} rows once"
    return (
        f"--num-prompts not given: replaying the first {num_prompts} of the trace's {rows} "
        f"rows (--num-prompts {rows} replays them all)"
    )


def rate_label(traffic: Traffic) -> str:
    """The arrival part of a result's file name: `trace`, `inf` or `<rate>qps`."""
    if traffic.arrival == "trace":
        return "trace"
    if traffic.rate is None or math.isinf(traffic.rate):
        return "infqps"
    return f"{traffic.rate:g}qps"
