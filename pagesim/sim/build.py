"""Assemble one replica from an `EngineConfig`: KV cache manager, scheduler, cost model, runner.

The same assembly serves `pagesim run`, sweeps, capacity plans and the validation report, so a
setting means the same thing everywhere.
"""

from __future__ import annotations

from pathlib import Path

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import CostModel
from pagesim.cost.profile import profile_dir
from pagesim.errors import ConfigError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.sizing import kv_capacity, page_size_bytes
from pagesim.scheduler.scheduler import Scheduler

# Shipped calibration profiles: calibration/<gpu>/<model>/ in the source tree.
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"


def default_profile(config: EngineConfig) -> Path | None:
    """The shipped profile measured for this model on this GPU at this tensor-parallel size
    (`calibration/<gpu>/<model>`, `<model>-tp<N>` for TP N), if there is one."""
    candidate = profile_dir(CALIBRATION_DIR, config.gpu, config.model,
                            config.tensor_parallel_size)
    return candidate if (candidate / "profile.json").is_file() else None


def build_kv_cache_manager(config: EngineConfig, num_gpu_blocks: int,
                           check_invariants: bool = False):
    """The paged manager, or a contiguous baseline over the same KV memory."""
    if config.allocator == "paged":
        return KVCacheManager(
            num_gpu_blocks=num_gpu_blocks, block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            sliding_window=config.model_spec.sliding_window,
            vllm_compat=config.vllm_compat, check_invariants=check_invariants)
    return ContiguousKVCacheManager(
        num_gpu_blocks=num_gpu_blocks, block_size=config.block_size, policy=config.allocator,
        placement=config.contiguous_placement, max_model_len=config.max_model_len, check_invariants=check_invariants)


def build_cost_model(config: EngineConfig, profile: str | Path | None) -> CostModel:
    """The calibrated model for `profile` (a directory), else the analytical default."""
    if profile is None:
        return AnalyticalCostModel(config.model_spec, config.gpu_spec,
                                   tensor_parallel_size=config.tensor_parallel_size,
                                   kv_cache_dtype=config.kv_cache_dtype)
    from pagesim.cost.calibrated import CalibratedCostModel
    from pagesim.cost.profile import Profile

    loaded = Profile.load(profile)
    meta = loaded.metadata
    if meta.model and meta.model != config.model:
        raise ConfigError(f"profile {profile} was measured for model {meta.model!r}, "
                          f"not {config.model!r}")
    return CalibratedCostModel(loaded, model=config.model_spec, gpu=config.gpu_spec,
                               tensor_parallel_size=config.tensor_parallel_size)


def build_scheduler(config: EngineConfig, check_invariants: bool = False) -> Scheduler:
    """A scheduler over a freshly sized KV cache."""
    capacity = kv_capacity(config)
    if capacity.num_gpu_blocks < 2:
        raise ConfigError(f"num_gpu_blocks={capacity.num_gpu_blocks}: need at least 2 "
                          "(one is the null block)")
    manager = build_kv_cache_manager(config, capacity.num_gpu_blocks, check_invariants)
    page = page_size_bytes(config.model_spec, config.block_size, config.kv_cache_dtype,
                           config.tensor_parallel_size)
    return Scheduler(config, manager, page_size_bytes=page)
