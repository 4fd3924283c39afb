"""Assemble one replica from an `EngineConfig`: scheduler (over `pagesim.scheduler.factory`),
cost model.

The same assembly serves `pagesim run`, sweeps, capacity plans and the validation report, so a
setting means the same thing everywhere.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import CostModel
from pagesim.cost.level_band import StepTimeBand, gpu_band, profile_band, widened
from pagesim.cost.profile import ProfileMetadata, profile_dir
from pagesim.data import calibration_dir, shipped_relative
from pagesim.errors import ConfigError
from pagesim.kvcache.sizing import kv_capacity
from pagesim.scheduler.factory import make_scheduler
from pagesim.scheduler.scheduler import Scheduler
from pagesim.sim.deferred_hashes import DeferredHashTable


def default_profile(config: EngineConfig) -> Path | None:
    """The shipped profile measured for this model on this GPU at this tensor-parallel size
    (`calibration/<gpu>/<model>`, `<model>-tp<N>` for TP N), if there is one."""
    candidate = profile_dir(
        calibration_dir(), config.gpu, config.model, config.tensor_parallel_size
    )
    return candidate if (candidate / "profile.json").is_file() else None


def transfer_profile(config: EngineConfig) -> Path | None:
    """The shipped profile of another GPU that prices this config by transfer
    (`pagesim.cost.transfer`): the source GPU's profile of the same model and TP, when no
    profile of this GPU ships (None on the source GPU itself, or when it has none either)."""
    from pagesim.cost.transfer import SOURCE_GPU, transfer_source_dir

    if config.gpu == SOURCE_GPU or default_profile(config) is not None:
        return None
    return transfer_source_dir(calibration_dir(), config.model, config.tensor_parallel_size)


def block_size_note(profile: str | Path, block_size: int) -> str | None:
    """A line for the user when `profile` never timed `block_size`: its step costs then come
    from the measured sizes around it (the nearest outside their range), which the result
    alone would not show. None when it was timed, or when the profile cannot be read (the
    simulation says what is wrong with it)."""
    from pagesim.cost.profile import Profile

    try:
        measured = Profile.load(profile).block_sizes
    except ConfigError:
        return None
    if not measured or block_size in measured:
        return None
    below = [b for b in measured if b < block_size]
    above = [b for b in measured if b > block_size]
    nearest = below[-1] if below else above[0]
    how = (
        f"interpolated between block sizes {below[-1]} and {above[0]}"
        if below and above
        else f"taken from block size {nearest}, the nearest"
    )
    sizes = ", ".join(str(b) for b in measured)
    return (
        f"note: {profile} measured block sizes {sizes}; block size {block_size}'s step "
        f"costs are {how}"
    )


def cost_model_line(
    config: EngineConfig,
    profile: str | Path | None,
    *,
    analytical: bool = False,
    step_time_scale: float = 1.0,
    disabled_corrections: tuple[str, ...] = (),
) -> str:
    """One line saying what priced the steps: a result's figures are as good as their cost
    model, a measured profile (which GPU, when) or the analytical roofline (`analytical`:
    chosen by the user, not for want of a profile), the factor on every step if any, and the
    corrections left off if any."""
    scaled = "" if step_time_scale == 1.0 else f"; every step x {step_time_scale:g}"
    off = f"; corrections off: {', '.join(disabled_corrections)}" if disabled_corrections else ""
    return _cost_model_name(config, profile, analytical) + scaled + off


def _cost_model_name(config: EngineConfig, profile: str | Path | None, analytical: bool) -> str:
    from pagesim.cost.profile import Profile

    if analytical:
        return "Cost model: analytical"
    source = transfer_profile(config) if profile is None else None
    if source is not None:
        from pagesim.cost.transfer_error import band_clause, transfer_note

        meta = Profile.load_metadata(source)
        return (
            f"Cost model: transfer of the shipped profile {shipped_relative(source)} "
            f"({meta.gpu_name}, measured {meta.date[:10]}) to {config.gpu} by each part's "
            f"bounding rate; {transfer_note(config.gpu, transfer_errors())}; "
            f"{band_clause(config.tensor_parallel_size)}"
        )
    if profile is None:
        return (
            f"Cost model: analytical (no calibration profile for {config.model} on "
            f"{config.gpu} at TP {config.tensor_parallel_size}; --profile DIR uses one)"
        )
    meta = Profile.load_metadata(profile)
    shipped = shipped_relative(profile)
    name = f"the shipped profile {shipped}" if shipped else str(profile)
    return (
        f"Cost model: calibrated, {name} ({meta.gpu_name}, {meta.dtype}, measured {meta.date[:10]})"
    )


def profile_path(profile: str | Path) -> str:
    """A profile's directory as a saved result names it: `calibration/<gpu>/<model>` inside the
    shipped data, else relative to the working folder; never absolute, so that a result reads
    the same on every machine."""
    return shipped_relative(profile) or Path(os.path.relpath(Path(profile).resolve())).as_posix()


def profile_record(profile: str | Path | None) -> dict[str, Any] | None:
    """What a saved result says of the profile that priced it (None: the analytical model):
    its name (`<gpu>/<model>`), format version, date measured and `profile_path`."""
    if profile is None:
        return None
    from pagesim.cost.profile import Profile

    meta = Profile.load_metadata(profile)
    tp = f"-tp{meta.tensor_parallel_size}" if meta.tensor_parallel_size > 1 else ""
    return {
        "name": f"{meta.gpu}/{meta.model}{tp}",
        "format_version": meta.format_version,
        "measured": meta.date,
        "path": profile_path(profile),
    }


def scaled_cost_model(
    config: EngineConfig,
    profile: str | Path | None,
    step_time_scale: float,
    transfer: bool = False,
    disabled_corrections: tuple[str, ...] = (),
) -> CostModel | None:
    """The model that prices every step `step_time_scale` times `build_cost_model`'s (with
    `disabled_corrections` off); None at 1.0 with every correction on, where the simulation
    builds its own (`pagesim.cost.scaled`). With `transfer` and no `profile`, the transfer
    model where `transfer_profile` finds a source (what `pagesim run` and `pagesim plan`
    price a GPU without a profile with)."""
    from pagesim.cost.scaled import ScaledCostModel, check_step_time_scale

    scale = check_step_time_scale(step_time_scale)
    source = transfer_profile(config) if transfer and profile is None else None
    if source is not None:
        model = transferred_cost_model(config, source, disabled_corrections)
    elif scale == 1.0 and not disabled_corrections:
        return None
    else:
        model = build_cost_model(config, profile, disabled_corrections)
    return model if scale == 1.0 else ScaledCostModel(model, scale)


def pricing_profile(
    config: EngineConfig, profile: str | Path | None, transfer: bool
) -> str | Path | None:
    """The profile whose measurements price a run: `profile`, else with `transfer` the source
    GPU's (`transfer_profile`), else None (the analytical model)."""
    if profile is not None or not transfer:
        return profile
    return transfer_profile(config)


def cost_model_label(config: EngineConfig, profile: str | Path | None, transfer: bool) -> str:
    """What kind of model priced a run, for its result JSON: `calibrated`, `transfer` or
    `analytical` (the same choice as `scaled_cost_model`'s)."""
    if profile is not None:
        return "calibrated"
    return "transfer" if pricing_profile(config, None, transfer) is not None else "analytical"


def step_time_band(config: EngineConfig, profile: str | Path | None, transfer: bool):
    """The `StepTimeBand` (`pagesim.cost.level_band`) of what prices `config`: the interval
    of the pricing profile's calibration levels, else pooled ones (`session_band`); widened
    by the transfer error when the steps are priced by transfer. None for the analytical
    model or where no levels were measured."""
    from pagesim.cost.profile import Profile

    source = pricing_profile(config, profile, transfer)
    if source is None:
        return None
    meta = Profile.load_metadata(source)
    band = session_band(meta)
    if band is None or profile is not None:
        return band
    from pagesim.cost.transfer import TransferCostModel
    from pagesim.cost.transfer_error import band_widening_pct

    share = 0.0
    if config.tensor_parallel_size > 1:  # the all-reduces' error weighs in too
        model = transferred_cost_model(config, Path(source))
        assert isinstance(model, TransferCostModel)
        share = model.allreduce_share()
    return widened(
        band, *band_widening_pct(config.gpu, transfer_errors(), share, transfer_served())
    )


@lru_cache(maxsize=1)
def transfer_errors() -> dict:
    """The transfer model's measured error per GPU (`pagesim.cost.transfer_error`), read once
    from the shipped table."""
    from pagesim.cost.transfer_error import ERRORS_FILE, read_errors
    from pagesim.data import transfer_dir

    return read_errors(transfer_dir() / ERRORS_FILE)


@lru_cache(maxsize=1)
def transfer_served() -> dict:
    """The transfer model's end-to-end error on the GPUs it was served on
    (`pagesim.cost.transfer_error.read_served`), read once from the shipped table."""
    from pagesim.cost.transfer_error import SERVED_FILE, read_served
    from pagesim.data import transfer_dir

    return read_served(transfer_dir() / SERVED_FILE)


def session_band(meta: ProfileMetadata) -> StepTimeBand | None:
    """The band of a profile's session-to-session spread (`pagesim.cost.level_band`): its own
    levels, else those of the merged profiles shipped for its GPU, else for the source GPU."""
    from pagesim.cost.transfer import SOURCE_GPU

    return (
        profile_band(meta)
        or gpu_band(_shipped_metadata(meta.gpu), meta.gpu)
        or gpu_band(_shipped_metadata(SOURCE_GPU), SOURCE_GPU, borrowed_for=meta.gpu)
    )


def _shipped_metadata(gpu: str) -> list:
    """The metadata of every profile shipped for `gpu`, in name order."""
    root = calibration_dir() / gpu
    if not root.is_dir():
        return []
    from pagesim.cost.profile import Profile

    return [
        Profile.load_metadata(d) for d in sorted(root.iterdir()) if (d / "profile.json").is_file()
    ]


def band_cost_model(
    config: EngineConfig,
    profile: str | Path | None,
    factor: float,
    transfer: bool,
    disabled_corrections: tuple[str, ...] = (),
) -> CostModel:
    """The model that prices every step `factor` times what `scaled_cost_model(..., 1.0,
    transfer, disabled_corrections)` would: one end of a band."""
    from pagesim.cost.scaled import ScaledCostModel

    off = disabled_corrections
    source = transfer_profile(config) if transfer and profile is None else None
    base = (
        transferred_cost_model(config, source, off)
        if source is not None
        else build_cost_model(config, profile, off)
    )
    return ScaledCostModel(base, factor)


def build_cost_model(
    config: EngineConfig, profile: str | Path | None, disabled_corrections: tuple[str, ...] = ()
) -> CostModel:
    """The calibrated model for `profile` (a directory) with `disabled_corrections` off
    (`pagesim.cost.corrections`), else the analytical default, which has no corrections.

    A calibrated model is fitted once per process for a profile's files as they are on disk
    (names, sizes, modification times) and engine: a sweep or a capacity search runs many
    simulations of one profile, and the fit (tenths of a second) would be paid by each. The
    model only memoizes pure arithmetic, so sharing it changes no result."""
    if profile is None:
        if disabled_corrections:
            raise ConfigError(
                f"disable_correction={disabled_corrections[0]!r}: the analytical cost model "
                "has no corrections (price the steps with a calibrated profile)"
            )
        return AnalyticalCostModel(
            config.model_spec,
            config.gpu_spec,
            tensor_parallel_size=config.tensor_parallel_size,
            kv_cache_dtype=config.kv_cache_dtype,
        )
    path = Path(profile)
    return _calibrated(
        str(path.resolve()),
        _files_stamp(path),
        str(profile),
        config.model,
        config.model_spec,
        config.gpu_spec,
        config.tensor_parallel_size,
        tuple(disabled_corrections),
    )


def _files_stamp(path: Path) -> tuple:
    """(name, size, mtime) of every file of a profile directory; empty where it cannot be
    listed (`Profile.load` then says what is wrong)."""
    stamp = []
    try:
        for f in path.iterdir():
            if f.is_file():
                st = f.stat()
                stamp.append((f.name, st.st_size, st.st_mtime_ns))
    except OSError:
        return ()
    return tuple(sorted(stamp))


@lru_cache(maxsize=8)
def _calibrated(
    resolved: str,
    stamp: tuple,
    shown: str,
    model: str,
    model_spec,
    gpu_spec,
    tensor_parallel_size: int,
    disabled_corrections: tuple[str, ...],
) -> CostModel:
    from pagesim.cost.calibrated import CalibratedCostModel
    from pagesim.cost.profile import Profile

    loaded = Profile.load(shown)
    meta = loaded.metadata
    if meta.model and meta.model != model:
        raise ConfigError(f"profile {shown} was measured for model {meta.model!r}, not {model!r}")
    return CalibratedCostModel(
        loaded,
        model=model_spec,
        gpu=gpu_spec,
        tensor_parallel_size=tensor_parallel_size,
        disabled_corrections=disabled_corrections,
    )


def transferred_cost_model(
    config: EngineConfig, source: Path, disabled_corrections: tuple[str, ...] = ()
) -> CostModel:
    """The profile at `source` (measured on `transfer.SOURCE_GPU`) carried to `config.gpu`
    by the transfer cost model."""
    from pagesim.cost.transfer import SOURCE_GPU, TransferCostModel
    from pagesim.specs import GPUSpec

    src_gpu = GPUSpec.from_name(SOURCE_GPU)
    calibrated = build_cost_model(replace(config, gpu=SOURCE_GPU), source, disabled_corrections)
    return TransferCostModel(
        calibrated,  # type: ignore[arg-type]
        config.model_spec,
        src_gpu,
        config.gpu_spec,
        tensor_parallel_size=config.tensor_parallel_size,
        kv_cache_dtype=config.kv_cache_dtype,
    )


def build_scheduler(config: EngineConfig, check_invariants: bool = False) -> Scheduler:
    """A scheduler over a freshly sized KV cache, with deferred hashes (prefix-cache blocks
    hashed only when a lookup can see them: the same decisions, less hashing)."""
    return make_scheduler(
        config, kv_capacity(config).num_gpu_blocks, check_invariants, DeferredHashTable
    )
