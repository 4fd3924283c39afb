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
from pagesim.kvcache.sizing import kv_capacity
from pagesim.planning.capacity import max_sustainable_rate
from pagesim.planning.capacity_report import binding_slo
from pagesim.planning.slo import SLOSpec
from pagesim.sim.build import (
    build_cost_model,
    default_profile,
    pricing_profile,
    scaled_cost_model,
)
from pagesim.sim.simulate import LoadSpec


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
        shapes = [
            (f"decode bs={b} ctx={context_len}", BatchShape.decode(b, context_len, bs))
            for b in batch_sizes
        ]
        shapes.append(
            (f"prefill {prefill_tokens} tokens", BatchShape.prefill(prefill_tokens, 0, bs))
        )
        for name, shape in shapes:
            rows.append(
                {"block_size": bs, "shape": name, "step_time_ms": 1000.0 * model.step_time(shape)}
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


# The decode shape whose step time stands for "the kernel's cost" in the comparison table.
KERNEL_SHAPE = (32, 2048)  # (batch, context tokens)


def compare_block_sizes(
    config: EngineConfig,
    load: LoadSpec,
    slos: SLOSpec,
    block_sizes: Sequence[int],
    *,
    profile: str | Path | None = None,
    rel_tol: float = 0.025,
    min_duration_s: float = 60.0,
    step_time_scale: float = 1.0,
    disabled_corrections: tuple[str, ...] = (),
    transfer: bool = True,
) -> list[dict]:
    """Per block size: the max rate within `slos` (`capacity.max_sustainable_rate`), with
    what explains it: the decode step time at `KERNEL_SHAPE` priced by the same cost model
    (measured per block size by a calibrated profile), and at the rate found the internal
    fragmentation (time-weighted share of the KV cache) and the prefix-cache hit rate.

    Every block size gets the same KV memory (`config`'s, in bytes), so only the block size
    changes; `disabled_corrections` are left off the calibrated model. With `transfer` and no
    `profile`, a GPU without a shipped profile is priced by transfer, as `pagesim run` prices
    it. Rows in the order given; `max_rate` None where no rate meets the SLOs."""

    kv_bytes = kv_capacity(config).available_kv_cache_memory_bytes
    measured = measured_block_sizes(config, pricing_profile(config, profile, transfer))
    rows = []
    for bs in block_sizes:
        engine = config.replace(
            block_size=bs, kv_cache_memory_bytes=kv_bytes, num_gpu_blocks_override=None
        )
        cost = scaled_cost_model(engine, profile, step_time_scale, transfer, disabled_corrections)
        priced = cost if cost is not None else build_cost_model(engine, profile)
        batch, context = KERNEL_SHAPE
        cap = max_sustainable_rate(
            engine,
            load,
            slos,
            profile=profile,
            rel_tol=rel_tol,
            min_duration_s=min_duration_s,
            cost_model=cost,
        )
        at = cap.result or {}
        rows.append(
            {
                "block_size": bs,
                "max_rate": cap.max_rate,
                "decode_step_ms": 1000.0 * priced.step_time(BatchShape.decode(batch, context, bs)),
                "kernel_measured": measured is not None and bs in measured,
                "internal_frag": at.get("kv_internal_frag_frac"),
                "prefix_hit_rate": at.get("prefix_cache_hit_rate"),
                "num_gpu_blocks": at.get("num_gpu_blocks"),
                "binding_slo": binding_slo(cap),
                "refused": cap.refused,
            }
        )
    return rows


def best_block_size(rows: list[dict]) -> dict | None:
    """The row with the highest rate within the SLOs (ties: the smaller block), or None."""
    found = [r for r in rows if r["max_rate"] is not None]
    return max(found, key=lambda r: (r["max_rate"], -r["block_size"])) if found else None


def block_size_table(rows: list[dict], profiled: bool, rel_tol: float = 0.0) -> list[str]:
    """The comparison as printed lines, then the best block size (and the others whose rate
    is within the search's `rel_tol` of it: a tie at the precision searched)."""
    batch, context = KERNEL_SHAPE
    lines = [
        f"{'block':>5}  {'max req/s':>9}  {'decode ms':>9}  {'kernel cost':<12}  "
        f"{'internal frag %':>15}  {'prefix hit %':>12}  binding SLO"
    ]
    for r in rows:
        rate = "-" if r["max_rate"] is None else f"{r['max_rate']:.3f}"
        source = (
            ("measured" if r["kernel_measured"] else "interpolated") if profiled else "analytical"
        )
        frag = "-" if r["internal_frag"] is None else f"{100 * r['internal_frag']:.2f}"
        hit = "-" if r["prefix_hit_rate"] is None else f"{100 * r['prefix_hit_rate']:.1f}"
        lines.append(
            f"{r['block_size']:>5}  {rate:>9}  {r['decode_step_ms']:>9.3f}  {source:<12}  "
            f"{frag:>15}  {hit:>12}  {r['binding_slo'] or '-'}"
        )
    lines.append(
        f"(decode ms: one decode step of {batch} requests at {context} tokens of context, as "
        "the cost model prices it; internal frag and prefix hits: at the rate found)"
    )
    best = best_block_size(rows)
    refused = next((r["refused"] for r in rows if r["refused"]), None)
    if best is None:
        lines.append("No block size meets the SLOs" + (f": {refused}" if refused else ""))
    else:
        ties = [
            r["block_size"]
            for r in rows
            if r is not best
            and r["max_rate"] is not None
            and r["max_rate"] >= best["max_rate"] * (1 - rel_tol)
        ]
        tie = f"; {', '.join(map(str, ties))} within --rel-tol {rel_tol:g} of it" if ties else ""
        lines.append(
            f"Best block size: {best['block_size']} ({best['max_rate']:.3f} req/s within the "
            f"SLOs{tie})"
        )
    return lines
