"""How fast a heavy step runs after light steps, against a burst of heavy ones (GPU state).

A served run at 50-95 % load runs mostly light decode-graph steps, and each prompt's prefill
comes as one heavy eager step among them; at rate inf the heavy steps come back to back. The
GPU's clock follows its recent load: on an H200 a 4,096-token prefill ran 5-6 % faster after
10-30 light steps than after three heavy ones, the SM clock at 1,965 MHz against
1,665-1,750 MHz (results/gpu_variance/heavy_after_light.csv). The calibration times its rows
in interleaved rounds of every kind of step, so its heavy rows sit somewhere between.

`measure_heavy_state` times, in one runner, a prefill of each of `tokens` (eager) after each
context, over rounds that take the contexts in a seeded random order:

    light_steps_before = 0   three untimed heavy steps first (a burst)
    light_steps_before = N   N untimed light steps first (decode graph, `light` entries)

Each row keeps the median and the burst median of its tokens. With the calibration's own
prefill row of the same tokens (timed in its rounds, in the same runner just before), the cost
model prices a heavy step after N light ones at (row at N) / (calibration row) of its
calibrated device time (`pagesim.cost.heavy_state`, `CalibratedCostModel.step_time_after`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np

from pagesim.cost.profile import HeavyStateRow
from pagesim.gpu.calibrate import BlockSource, synthetic_step

#: Heavy steps before the timed one in a burst (`light_steps_before` 0).
BURST_HEAVY_STEPS = 3


def _timed(runner, step) -> float:
    """Seconds of one step on the host clock (`execute_model` ends with a device sync)."""
    t = time.perf_counter()
    runner.execute_model(step)
    return time.perf_counter() - t


def measure_heavy_state(runner, block_size: int, tokens: Sequence[int],
                        light: list[tuple[int, int]], rounds: int,
                        light_steps_before: Sequence[int], seed: int = 0
                        ) -> list[HeavyStateRow]:
    """Rows for every (prefill tokens, light steps before); `light` is the light step's
    `(context, new)` entries. Points whose blocks do not fit are left out."""
    if 0 not in light_steps_before:
        raise ValueError("light_steps_before must hold 0: the burst every row is taken against")
    blocks = runner.num_gpu_blocks
    light_step = synthetic_step(light, block_size, BlockSource(blocks, seed + 1))
    if light_step is None:
        return []
    rng = np.random.default_rng([seed, 0x4EA7])
    rows = []
    for n in tokens:
        heavy = synthetic_step([(0, n)], block_size, BlockSource(blocks, seed + 2))
        if heavy is None:
            continue
        for step in (light_step, heavy, light_step, heavy):  # compiles, graph capture
            runner.execute_model(step)
        times: dict[int, list[float]] = {k: [] for k in light_steps_before}
        for _ in range(rounds):
            for i in rng.permutation(len(light_steps_before)).tolist():
                k = light_steps_before[i]
                before = (heavy, BURST_HEAVY_STEPS) if k == 0 else (light_step, k)
                for _ in range(before[1]):
                    runner.execute_model(before[0])
                times[k].append(_timed(runner, heavy))
        burst = statistics.median(times[0]) * 1e3
        rows += [HeavyStateRow(block_size, n, k, statistics.median(times[k]) * 1e3, burst)
                 for k in light_steps_before]
    return rows
