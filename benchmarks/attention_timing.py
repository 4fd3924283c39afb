"""Timing helper for the attention benchmarks: CUDA-graph replay, median of replays.

A graph holds enough calls (cycling over the rotated inputs) to run about 2 ms, so launch gaps
and the graph launch itself are a small share; each replay is timed with CUDA events and the
median per call is returned with the fastest and slowest replay. If a call cannot be captured
(some library paths refuse capture), the same is done with plain launches and events.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

TARGET_REPLAY_S = 2e-3
MAX_CALLS = 256


class Timing(NamedTuple):
    median_s: float  # per call
    min_s: float
    max_s: float
    method: str  # "graph" or "launches"


def _events_time(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def time_calls(
    calls: Sequence[Callable[[], object]], reps: int = 10, warmup: int = 3, use_graph: bool = True
) -> Timing:
    """Seconds per call: median, min and max over `reps` timed replays."""
    for c in calls:  # compile / pick algorithms outside the graph
        c()
    torch.cuda.synchronize()
    one = _events_time(lambda: [c() for c in calls]) / len(calls)
    n = max(len(calls), min(MAX_CALLS, math.ceil(TARGET_REPLAY_S / max(one, 1e-7))))
    seq = [calls[i % len(calls)] for i in range(n)]

    def run_all():
        for c in seq:
            c()

    replay, method = run_all, "launches"
    if use_graph:
        try:
            graph = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run_all()
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):
                run_all()
            replay, method = graph.replay, "graph"
        except RuntimeError as e:
            print(
                f"  (graph capture failed, timing launches: {str(e).splitlines()[0][:80]})",
                flush=True,
            )
            torch.cuda.synchronize()
            replay = run_all
    for _ in range(warmup):
        replay()
    times = [_events_time(replay) / n for _ in range(reps)]
    return Timing(statistics.median(times), min(times), max(times), method)
