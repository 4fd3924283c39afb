"""Block size against kernel cost: what the cost model says one step takes per block size.

A larger block wastes more of each request's last block (internal fragmentation) and shares
prefixes only in whole blocks, but the paged attention kernel walks fewer block-table
entries. The kernel side comes from the cost model the simulator uses: the calibrated profile
measured on the GPU when one is shipped for this model and GPU (`calibration/<gpu>/<model>/`),
else the analytical roofline (whose per-block overhead is an assumption, not a measurement).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.sim.build import build_cost_model, default_profile


def cost_source(config: EngineConfig, profile: str | Path | None = None) -> str:
    """`calibrated (<dir>)` or `analytical`, for the model and GPU of `config` (the folder
    relative to the working directory: no machine's absolute path in a saved notebook)."""
    found = profile or default_profile(config)
    return f"calibrated ({os.path.relpath(found)})" if found else "analytical"


def step_time_by_block_size(
    config: EngineConfig,
    block_sizes: Sequence[int],
    *,
    batch_sizes: Sequence[int] = (1, 32, 128),
    context_len: int = 2048,
    prefill_tokens: int = 2048,
    profile: str | Path | None = None,
) -> pd.DataFrame:
    """Decode steps (batch x context) and one prefill of `prefill_tokens` per block size.

    Columns: block_size, shape ("decode bs=32 ctx=2048" ...), step_time_ms, relative (to the
    smallest block size of the same shape)."""
    model = build_cost_model(config, profile or default_profile(config))
    rows = []
    for bs in block_sizes:
        for b in batch_sizes:
            rows.append(
                {
                    "block_size": bs,
                    "shape": f"decode bs={b} ctx={context_len}",
                    "step_time_ms": 1000.0 * model.step_time(BatchShape.decode(b, context_len, bs)),
                }
            )
        rows.append(
            {
                "block_size": bs,
                "shape": f"prefill {prefill_tokens} tokens",
                "step_time_ms": 1000.0 * model.step_time(BatchShape.prefill(prefill_tokens, 0, bs)),
            }
        )
    df = pd.DataFrame(rows)
    first = df.groupby("shape")["step_time_ms"].transform("first")
    df["relative"] = df["step_time_ms"] / first
    return df


def measured_block_sizes(
    config: EngineConfig, profile: str | Path | None = None
) -> list[int] | None:
    """Block sizes the calibration profile measured (None: no profile for this config)."""
    found = profile or default_profile(config)
    if not found:
        return None
    from pagesim.cost.profile import Profile

    return sorted(int(b) for b in Profile.load(found).block_sizes)
