"""Preemption under memory pressure: recompute versus swap, by block size and host link.

Every run gets the same KV memory (`kv_cache_memory_bytes`), so a block size changes only how
the memory is cut. Swap cost is bytes over the host link: the host-link bandwidth is varied by
running the analytical cost model on a copy of the GPU spec with another
`host_link_bytes_per_s` (PCIe 4.0 x16 ~ 32 GB/s, PCIe 5.0 x16 ~ 64 GB/s, and slower links).
Recompute does not use the host link, so it runs once per block size and rate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.metrics.report import HEADLINE_METRICS
from pagesim.planning.router import make_router
from pagesim.sim.cluster import simulate_cluster
from pagesim.sim.simulate import LoadSpec

KEYS = (
    *HEADLINE_METRICS,
    "mean_e2el_ms",
    "num_preemptions",
    "num_swap_preemptions",
    "recomputed_tokens",
    "swapped_out_bytes",
    "swapped_in_bytes",
    "kv_cache_usage_mean",
    "completed",
)


def with_host_link(config: EngineConfig, host_link_gbps: float) -> AnalyticalCostModel:
    """The analytical cost model of `config` on a GPU whose host link moves `host_link_gbps`
    GB/s in each direction."""
    gpu = dataclasses.replace(config.gpu_spec, host_link_bytes_per_s=host_link_gbps * 1e9)
    return AnalyticalCostModel(
        config.model_spec,
        gpu,
        tensor_parallel_size=config.tensor_parallel_size,
        kv_cache_dtype=config.kv_cache_dtype,
    )


def preemption_study(
    config: EngineConfig,
    load: LoadSpec,
    *,
    rates: Sequence[float],
    block_sizes: Sequence[int],
    host_link_gbps: Sequence[float],
) -> pd.DataFrame:
    """One row per (mode, block size, host link, rate): the run's metrics and settings.

    `host_link_gbps` is NaN for recompute rows (the link is not used)."""
    rows = []
    for bs in block_sizes:
        for mode, links in (("recompute", [float("nan")]), ("swap", list(host_link_gbps))):
            for gbps in links:
                cfg = config.replace(block_size=bs, preemption_mode=mode)
                link = gbps if mode == "swap" else cfg.gpu_spec.host_link_bytes_per_s / 1e9
                cost = with_host_link(cfg, link)
                for rate in rates:
                    run = simulate_cluster(
                        cfg,
                        dataclasses.replace(load, request_rate=rate),
                        1,
                        make_router("round-robin"),
                        cost_model=cost,
                    )
                    row = {
                        "preemption_mode": mode,
                        "block_size": bs,
                        "host_link_gbps": gbps,
                        "request_rate": rate,
                        "model": cfg.model,
                        "gpu": cfg.gpu,
                        "workload": load.workload,
                        "status": "ok",
                    }
                    row.update({k: run.result[k] for k in KEYS})
                    rows.append(row)
    df = pd.DataFrame(rows)
    df["label"] = [
        m if m == "recompute" else f"swap @ {g:g} GB/s"
        for m, g in zip(df["preemption_mode"], df["host_link_gbps"], strict=True)
    ]
    return df
