"""Assemble one replica from an `EngineConfig`: scheduler (over `pagesim.scheduler.factory`),
cost model.

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
from pagesim.kvcache.sizing import kv_capacity
from pagesim.scheduler.factory import make_scheduler
from pagesim.scheduler.scheduler import Scheduler

# Shipped calibration profiles: calibration/<gpu>/<model>/ in the source tree.
CALIBRATION_DIR = Path(__file__).resolve().parents[2] / "calibration"


def default_profile(config: EngineConfig) -> Path | None:
    """The shipped profile measured for this model on this GPU at this tensor-parallel size
    (`calibration/<gpu>/<model>`, `<model>-tp<N>` for TP N), if there is one."""
    candidate = profile_dir(CALIBRATION_DIR, config.gpu, config.model,
                            config.tensor_parallel_size)
    return candidate if (candidate / "profile.json").is_file() else None


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
    """A scheduler over a freshly sized KV cache, hashing prefix-cache blocks lazily (only
    when a lookup can see them: the same decisions, less hashing)."""
    return make_scheduler(config, kv_capacity(config).num_gpu_blocks, check_invariants,
                          lazy_hashing=True)
