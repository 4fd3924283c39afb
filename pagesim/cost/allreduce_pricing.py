"""A tensor-parallel profile's all-reduce time per step, from its table or the analytical term."""

from __future__ import annotations

from pagesim.cost.analytical import AnalyticalCostModel, num_allreduces_per_step
from pagesim.cost.profile import Profile
from pagesim.cost.surface import Pwl
from pagesim.errors import ConfigError
from pagesim.specs import GPUSpec, ModelSpec

US = 1e-6


def allreduce_pricer(profile: Profile, model: ModelSpec | None, gpu: GPUSpec | None):
    """(tokens -> seconds of a step's all-reduces, its source), or (None, None) when there is
    nothing to price (TP 1) or nothing to price it with. Raises when a shard-only profile
    (`allreduce_in_step_times` false) cannot be priced: its steps would miss their
    communication."""
    meta = profile.metadata
    tp = meta.tensor_parallel_size
    if tp == 1:
        return None, None
    table = allreduce_table(profile, tp)
    if model is not None and table is not None:
        count = num_allreduces_per_step(model, tp)
        per_token = model.hidden_size * model.dtype_bytes
        return (lambda tokens: count * table(tokens * per_token)), "allreduce.csv"
    if model is not None and gpu is not None:
        analytical = AnalyticalCostModel(
            model, gpu, tensor_parallel_size=tp, kv_cache_dtype=meta.kv_cache_dtype
        )
        return analytical.allreduce_time, "analytical"
    if not meta.allreduce_in_step_times:
        raise ConfigError(
            f"tensor_parallel_size={tp}: the profile timed one rank's shard "
            "without communication; pass model= (with an allreduce.csv for "
            f"tp {tp}, or gpu= for the analytical all-reduce term)"
        )
    return None, None


def allreduce_table(profile: Profile, tp: int) -> Pwl | None:
    """Seconds of one all-reduce by message bytes, from the profile's `allreduce.csv` rows at
    `tp` GPUs; None when it has none."""
    rows = [r for r in profile.allreduce if r.tp == tp]
    if not rows:
        return None
    return Pwl({r.message_bytes: [r.time_us * US] for r in rows})


def allreduce_per_call_s(profile: Profile, tp: int) -> float | None:
    """The per-call time of the profile's all-reduces at `tp` GPUs: the smallest time its
    `allreduce.csv` measured (at its smallest messages the bytes take next to nothing: ~25 us
    on 2 x H200), what an all-reduce costs before any byte moves. None without a table."""
    rows = [r for r in profile.allreduce if r.tp == tp]
    return min(r.time_us for r in rows) * US if rows else None
