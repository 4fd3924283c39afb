"""KV sizing: the smallest KV cache that meets SLOs at a target request rate.

The search runs over whole KV blocks, between one request of `max_model_len` (the least vLLM
starts with) and what `gpu_memory_utilization=1.0` leaves after weights and activations
(`search.search_min`); each probe runs the load with `kv_cache_memory_bytes` set to that many
blocks. The answer is given both as KV bytes and as the `gpu_memory_utilization` that yields
at least that many blocks under pagesim's sizing (`kvcache.sizing`), so it can be passed to
`vllm serve` either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import ConfigError
from pagesim.kvcache.sizing import estimate_non_kv_memory, kv_capacity
from pagesim.planning.capacity import DEFAULT_MIN_DURATION_S, SearchPoint, _search_point, plan_load
from pagesim.planning.search import search_min
from pagesim.planning.slo import SLOSpec
from pagesim.sim.simulate import LoadSpec, simulate


@dataclass(frozen=True)
class KVSizing:
    """Smallest KV memory per GPU meeting the SLOs at `target_rate`; None fields: even the
    largest KV cache the GPU can hold failed."""

    target_rate: float
    num_gpu_blocks: int | None
    kv_cache_memory_bytes: int | None
    gpu_memory_utilization: float | None  # smallest (to 0.001) giving >= num_gpu_blocks
    max_num_gpu_blocks: int  # at gpu_memory_utilization = 1.0
    result: dict[str, Any] | None
    probes: tuple[SearchPoint, ...]  # value = num_gpu_blocks


def min_kv_memory(
    config: EngineConfig,
    load: LoadSpec,
    slos: SLOSpec,
    target_rate: float,
    *,
    profile: str | Path | None = None,
    rel_tol: float = 0.02,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
    cost_model: CostModel | None = None,
) -> KVSizing:
    """Fewest KV blocks (and bytes, and memory fraction) meeting `slos` at `target_rate`."""
    if slos.empty:
        raise ConfigError("--slo: give at least one objective, e.g. p99_ttft_ms<=500")
    if not target_rate > 0 or math.isinf(target_rate):
        raise ConfigError(f"--target-rate {target_rate!r}: must be a finite rate > 0")
    if config.num_gpu_blocks_override is not None:
        raise ConfigError(
            "num_gpu_blocks_override is set: KV sizing searches the KV memory "
            "itself; drop the override"
        )
    base = config.replace(kv_cache_memory_bytes=None)
    full = kv_capacity(base.replace(gpu_memory_utilization=1.0))
    page = full.page_size_bytes
    floor_blocks = full.blocks_per_request + 1  # one max_model_len request + the null block
    if full.num_gpu_blocks < floor_blocks:
        raise ConfigError(
            f"{config.model} on {config.gpu}: even gpu_memory_utilization=1.0 "
            "holds no request of max_model_len"
        )
    probes: dict[int, SearchPoint] = {}
    load = plan_load(load, slos, target_rate, min_duration_s=min_duration_s)

    def passes(blocks: float) -> bool:
        n = int(math.ceil(blocks - 1e-9))
        if n not in probes:
            run = simulate(
                base.replace(kv_cache_memory_bytes=n * page),
                load,
                profile=profile,
                cost_model=cost_model,
            )
            probes[n] = _search_point(n, slos, run.result)
        return probes[n].passed

    most = float(full.num_gpu_blocks)  # the search starts from the whole KV cache
    b = search_min(passes, most, float(floor_blocks), most, rel_tol=rel_tol)
    tried = tuple(probes.values())
    if b.best is None:
        return KVSizing(target_rate, None, None, None, full.num_gpu_blocks, None, tried)
    blocks = int(math.ceil(b.best - 1e-9))
    util, result = utilization_for_blocks(base, blocks), probes[blocks].result
    return KVSizing(target_rate, blocks, blocks * page, util, full.num_gpu_blocks, result, tried)


def utilization_for_blocks(config: EngineConfig, num_gpu_blocks: int) -> float | None:
    """Smallest gpu_memory_utilization (in steps of 0.001) whose KV cache has at least
    `num_gpu_blocks` blocks; None if even 1.0 has fewer."""
    gpu = config.gpu_spec
    non_kv = estimate_non_kv_memory(config)
    page = kv_capacity(config.replace(gpu_memory_utilization=1.0)).page_size_bytes
    need = non_kv.total_bytes + num_gpu_blocks * page
    util = math.ceil(1000.0 * need / gpu.memory_bytes) / 1000.0
    while util <= 1.0:
        try:
            blocks = kv_capacity(config.replace(gpu_memory_utilization=util)).num_gpu_blocks
            if blocks >= num_gpu_blocks:
                return util
        except ConfigError:  # too little memory for the weights or one request
            pass
        util = round(util + 0.001, 3)
    return None
