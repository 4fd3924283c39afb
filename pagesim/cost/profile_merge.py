"""Several calibrations of one (GPU, model) folded into one profile: each grid point's median.

Why: the same step on the same kind of GPU runs a few % faster or slower from one GPU session
to the next (the machine's clocks, its host), and a profile measured in one session carries
that session's level into every prediction, a spread as wide as a validation's 3 % targets
(docs/cost_model.md). A calibration is a measurement; measured several times, its best
estimate is the median of each point, as `pagesim calibrate` already takes the median of each
point over rounds inside one session.

The rules, so that the merged profile stays a measurement and not a blend of different ones:

- every source must describe the same setup: GPU, model, dtypes, tensor parallelism, kernels
  and their tiles, CUDA graph sizes, memory utilization, and software (driver, CUDA, torch,
  triton): a profile of another stack times another step, and merging it is refused;
- each table's grid points are the union of the sources'; each time column of a point is the
  median over the sources that measured it (with an even count, the mean of the middle two),
  each source's step times first divided by its level (below). Sessions measured different
  grids (a newer calibration times more block sizes), and a point only a few sessions
  measured would otherwise carry their speed level: block sizes would be compared at
  different levels, a few % apart, as large as the differences a block-size sweep ranks;
- the measured KV block count per block size is the smallest any source measured (a cache
  that one session could not hold is not promised); the host-overhead scalars and the pinned
  copy rate are medians over the sources that measured them;
- `date` is the newest source's; `notes` says how many sources and when each was measured;
- `source_scales` records the spread: each source's level against the merged profile, the
  median over the source's step rows of its time over the merged time of the same point,
  counting only points that two or more sources measured (`source_scales`). The band an
  answer moves in with the GPU's speed level is drawn from them (`pagesim.cost.level_band`).

    merged = merge_profiles([Profile.load(p) for p in paths])
    merged.save("calibration/h200/llama-2-7b")
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from statistics import median

from pagesim.cost.profile import Profile, ProfileError, ProfileMetadata
from pagesim.cost.profile_rows import KEY_COLUMNS, TABLES

__all__ = ["SAME_SETUP_KEYS", "merge_profiles", "source_deviation", "source_scale", "source_scales"]

#: metadata every source must share: what was measured, on what, with which software
SAME_SETUP_KEYS = (
    "gpu",
    "model",
    "gpu_name",
    "dtype",
    "kv_cache_dtype",
    "tensor_parallel_size",
    "allreduce_in_step_times",
    "attention_backend",
    "cuda_graph_sizes",
    "cuda_graph_token_sizes",
    "varlen_block_q",
    "varlen_tile_n",
    "decode_tile_n",
    "decode_programs_per_sm",
    "gpu_memory_utilization",
    "driver",
    "cuda",
    "torch",
    "triton",
    "synthetic",
    "format_version",
)


def merge_profiles(profiles: Sequence[Profile]) -> Profile:
    """One profile whose every grid point is the median of the sources' measurements of it.

    Raises `ProfileError` naming the first metadata key on which two sources differ."""
    if not profiles:
        raise ProfileError("merge: no profiles given")
    first = profiles[0].metadata
    for i, p in enumerate(profiles[1:], start=2):
        for key in SAME_SETUP_KEYS:
            a, b = getattr(first, key), getattr(p.metadata, key)
            if a != b:
                raise ProfileError(
                    f"merge: profile 1 and profile {i} differ in {key} "
                    f"({a!r} vs {b!r}); only calibrations of one setup merge"
                )
    meta = _merge_metadata([p.metadata for p in profiles])
    as_measured = Profile(meta, **_merge_tables(profiles, [1.0] * len(profiles)))
    tables = _merge_tables(profiles, source_scales(profiles, as_measured))
    scales = [round(scale, 6) for scale in source_scales(profiles, Profile(meta, **tables))]
    return Profile(dataclasses.replace(meta, source_scales=scales), **tables)


def _merge_tables(profiles: Sequence[Profile], levels: Sequence[float]) -> dict[str, tuple]:
    """Every table merged, each source's step times divided by its level first."""
    steps = _step_tables()
    return {
        name: _merge_table(
            name,
            [getattr(p, name) for p in profiles],
            levels if name in steps else [1.0] * len(profiles),
        )
        for name in TABLES
    }


def source_scales(sources: Sequence[Profile], merged: Profile) -> list[float]:
    """Each source's level against `merged` (`source_scale`), over the grid points that two
    or more sources measured. A point only one source measured is its own merged value: its
    ratio is 1 by construction and says nothing of the session, yet counted it would pull
    that source's level toward 1 (a source that measured a larger grid than the others would
    look as fast as the median, however slow it ran)."""
    counts: dict[str, Counter[tuple]] = {
        table: Counter(
            dataclasses.astuple(r)[: KEY_COLUMNS[table]] for p in sources for r in getattr(p, table)
        )
        for table in _step_tables()
    }
    shared = {table: {k for k, n in c.items() if n >= 2} for table, c in counts.items()}
    if not any(shared.values()):  # one source, or none shares a point: no spread measured
        return [1.0] * len(sources)
    return [source_scale(source, merged, shared) for source in sources]


def source_scale(
    source: Profile, merged: Profile, points: dict[str, set[tuple]] | None = None
) -> float:
    """How fast `source`'s session ran against `merged`: the median, over `source`'s step rows
    (all tables that time steps; only the grid points in `points[table]` when given), of its
    step time over the merged time of the same grid point. A median of ratios, so that the
    few points one session measured oddly do not move its level."""
    ratios = [
        1 + d
        for table in _step_tables()
        for d in source_deviation(source, merged, table, None if points is None else points[table])
    ]
    if not ratios:
        raise ProfileError("merge: a source has no step rows to compare with the merged profile")
    return median(ratios)


def source_deviation(
    source: Profile, merged: Profile, table: str = "decode", points: set[tuple] | None = None
) -> list[float]:
    """Each of `source`'s rows of `table` (of the grid points in `points`, when given) against
    the merged row of the same point: the ratio of the step times less 1, in the source's row
    order (how far that session sat from the median)."""
    k = KEY_COLUMNS[table]
    merged_time = {dataclasses.astuple(r)[:k]: r.step_time_ms for r in getattr(merged, table)}
    rows = ((dataclasses.astuple(r)[:k], r.step_time_ms) for r in getattr(source, table))
    return [
        time / merged_time[key] - 1
        for key, time in rows
        if time > 0 and (points is None or key in points)
    ]


def _step_tables() -> list[str]:
    """The tables whose rows time steps."""
    return [
        table
        for table, (row_cls, _) in TABLES.items()
        if "step_time_ms" in {f.name for f in dataclasses.fields(row_cls)}
    ]


def _merge_table(name: str, sources: list[tuple], levels: Sequence[float]) -> tuple:
    """The union of the sources' grid points, in the order each first appears; every
    non-key column the median over the sources that measured the point, each source's values
    divided by its level (1: as measured)."""
    row_cls = TABLES[name][0]
    k = KEY_COLUMNS[name]
    measured: dict[tuple, list[tuple]] = {}
    for rows, level in zip(sources, levels, strict=True):
        for row in rows:
            values = dataclasses.astuple(row)
            times = values[k:] if level == 1 else tuple(v / level for v in values[k:])
            measured.setdefault(values[:k], []).append(times)
    return tuple(
        row_cls(*key, *(median(column) for column in zip(*values, strict=True)))
        for key, values in measured.items()
    )


def _merge_metadata(sources: list[ProfileMetadata]) -> ProfileMetadata:
    first = sources[0]
    blocks: dict[int, int] = {}
    for meta in sources:
        for size, n in meta.num_gpu_blocks.items():
            blocks[size] = min(n, blocks.get(size, n))
    grid: dict[str, set[int]] = {}
    for meta in sources:
        for axis, values in meta.grid.items():
            grid.setdefault(axis, set()).update(values)
    dates = [meta.date for meta in sources]
    notes = (
        f"the median of {len(sources)} calibrations (pagesim.cost.profile_merge), "
        f"measured {', '.join(dates)}; the first's notes: {first.notes}"
    )
    return dataclasses.replace(
        first,
        date=max(dates),
        notes=notes,
        num_gpu_blocks=dict(sorted(blocks.items())),
        grid={axis: sorted(values) for axis, values in grid.items()},
        overhead_prefill_step_ms=_median_of_known(s.overhead_prefill_step_ms for s in sources),
        overhead_per_prefill_ms=_median_of_known(s.overhead_per_prefill_ms for s in sources),
        host_link_bytes_per_s=_median_of_known(s.host_link_bytes_per_s for s in sources),
    )


def _median_of_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return median(known) if known else None
