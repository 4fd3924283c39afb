"""How much faster a heavy step runs after light steps than the calibration timed it.

The GPU's clock follows its recent load: a prefill step that comes after decode-graph steps
runs faster than one inside a burst of heavy steps (on an H200, 5-6 % after 10-30 light steps;
results/gpu_variance/heavy_after_light.csv). The calibration times its rows in interleaved
rounds of every kind of step, a state between the two. Its heavy_state rows time the same
prefill steps after a known number of light steps (`pagesim.gpu.heavy_state`), in the same
runner right after the rows, so each row's time over the calibration's prefill row of the same
tokens is the factor a heavy step after that many light steps takes on its calibrated time.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence
from statistics import mean

from pagesim.cost.profile import Profile


def heavy_state_factors(profile: Profile) -> tuple[tuple[int, float], ...]:
    """(light steps before, factor) points, ascending: per count, the mean over the measured
    prefill sizes of the heavy_state row's time over the calibration's prefill row (same block
    size and tokens, nothing cached). Empty without rows, or without such a prefill row."""
    calibrated = {(r.block_size, r.num_new_tokens): r.step_time_ms
                  for r in profile.prefill if r.num_cached_tokens == 0}
    ratios: dict[int, list[float]] = defaultdict(list)
    for r in profile.heavy_state:
        cal = calibrated.get((r.block_size, r.heavy_tokens))
        if cal:
            ratios[r.light_steps_before].append(r.step_time_ms / cal)
    return tuple((k, mean(v)) for k, v in sorted(ratios.items()))


def interpolate(points: Sequence[tuple[int, float]], x: float) -> float:
    """Piecewise linear through `points` (ascending x), flat beyond the first and last."""
    xs = [p[0] for p in points]
    i = bisect_right(xs, x)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
