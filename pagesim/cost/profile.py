"""The versioned calibration profile: measured step times of one (GPU, model) pair.

On disk, `calibration/<gpu>/<model>/` holds

    profile.json   metadata: format_version, GPU, driver, CUDA, torch, triton, dtypes, date, grid,
                   measured num_gpu_blocks per block size, gpu_memory_utilization, method, notes
    decode.csv     block_size, batch_size, context_len, step_time_ms, step_time_p10_ms,
                   step_time_p90_ms, attention_ms, other_ms
    prefill.csv    block_size, num_new_tokens, num_cached_tokens, step_time_ms, ... (as decode)
    mixed.csv      (optional) one prefill chunk plus a decode batch of equal contexts:
                   block_size, num_new_tokens, num_cached_tokens, decode_batch_size,
                   decode_context_len, step_time_ms, ... (as decode)
    multi_prefill.csv  (optional) several prefill entries in one step, all alike:
                   block_size, num_entries, num_new_tokens, num_cached_tokens (each entry's),
                   step_time_ms, ... (as decode)
    decode_shared.csv  (optional) decode rows whose sequences share their first shared_len
                   tokens (the same blocks): block_size, batch_size, context_len, shared_len,
                   step_time_ms, ... (as decode), reference_step_time_ms (the same step over
                   distinct blocks, same session)
    decode_spread.csv  (optional) decode rows whose contexts share one mean but not one length:
                   block_size, batch_size, context_len (the mean), longest_context_len,
                   step_time_ms, ... (as decode), uniform_step_time_ms (every context at the
                   mean, same rounds)
    decode_shared_spread.csv  (optional) decode rows whose sequences share their first
                   shared_len tokens and then have own parts of spread lengths: block_size,
                   batch_size, context_len (the mean), longest_context_len, shared_len,
                   step_time_ms, ... (as decode), reference_step_time_ms
    varlen_shared.csv  (optional) steps through the variable-length kernel whose decodes and
                   prefill entries share a cached prefix: block_size, num_decodes,
                   decode_context_len, num_entries, num_new_tokens, shared_len,
                   step_time_ms, ... (as decode), reference_step_time_ms
    overhead.csv   (optional) num_reqs, overhead_ms, overhead_p10_ms, overhead_p90_ms
    allreduce.csv  (optional) tp, message_bytes, time_us, time_p10_us, time_p90_us: one sum
                   all-reduce of `message_bytes` over `tp` GPUs (median and spread)

Semantics of a row: `step_time_ms` is the median device time of the step over repeats (p10/p90
its spread); `attention_ms` the time inside attention kernels (all layers) and `other_ms` the
rest of the step (`attention_ms + other_ms` is about `step_time_ms`). Contexts are
`num_computed_tokens` before the step, as in `BatchShape`: a decode row runs `batch_size`
sequences of one new token over `context_len` cached tokens each. `overhead.csv` holds host time
spent between steps (input preparation), outside the measured device time.

Tensor parallelism: `tensor_parallel_size` N > 1 says the step rows time an N-way sharded
model. `allreduce_in_step_times` says how: true, the steps ran on N GPUs and include their
all-reduces; false, one rank's shard ran alone on one GPU (no communication) and the cost
model adds the all-reduces (from `allreduce.csv`, else the analytical term).

The reader takes only the current `format_version` (`PROFILE_FORMAT_VERSION`); an older
profile is refused with one line naming `pagesim migrate-profile`, which converts it
(`pagesim.cost.profile_migrate` says what each version added).

A profile may carry `source_scales`: a merged profile's spread, each source calibration's
step-time level against the merged one (`pagesim.cost.profile_merge`); run and plan price at
its ends to say how far a GPU's speed level moves an answer. Optional: written only when known.

The GPU calibrator builds a `Profile(ProfileMetadata(...), decode=..., prefill=..., ...)` and
saves it under `profile_dir(root, gpu, model)`; the simulator loads it with `Profile.load`.

Any malformed file raises `ProfileError` with one line naming the file, the line, the field and
the value. Floats are written with `repr`, so save-then-load is exact.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pagesim.config import KV_CACHE_DTYPES
from pagesim.cost.profile_rows import (
    KEY_COLUMNS,
    TABLES,
    AllReduceRow,
    DecodeRow,
    DecodeSharedRow,
    DecodeSharedSpreadRow,
    DecodeSpreadRow,
    MixedRow,
    MultiPrefillRow,
    OverheadRow,
    PrefillRow,
    VarlenSharedRow,
)
from pagesim.errors import ConfigError
from pagesim.specs import shipped_spec

__all__ = [
    "PROFILE_FORMAT_VERSION",
    "TABLES",
    "AllReduceRow",
    "DecodeRow",
    "DecodeSharedRow",
    "DecodeSharedSpreadRow",
    "DecodeSpreadRow",
    "MixedRow",
    "MultiPrefillRow",
    "OverheadRow",
    "PrefillRow",
    "Profile",
    "ProfileError",
    "ProfileMetadata",
    "VarlenSharedRow",
    "profile_dir",
]

PROFILE_FORMAT_VERSION = 6  # the one version `Profile.load` reads
PROFILE_JSON = "profile.json"


class ProfileError(ConfigError):
    """A calibration profile that is missing, malformed or of an unsupported version."""


@dataclass(frozen=True)
class ProfileMetadata:
    """Everything needed to trust, or distrust, the numbers in the tables."""

    gpu: str  # pagesim GPU name (specs.GPUS key), e.g. "h200"
    model: str  # pagesim model name (specs.MODELS key)
    gpu_name: str  # as the driver reports it, e.g. "NVIDIA H200"
    driver: str
    cuda: str
    torch: str
    triton: str
    dtype: str  # weights/activations, e.g. "bfloat16"
    date: str  # ISO 8601
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    # TP > 1 only: true, step rows were timed on the whole group (all-reduces included); false,
    # on one rank's shard alone (the cost model adds the all-reduces)
    allreduce_in_step_times: bool = True
    attention_backend: str = ""  # kernel name/version timed
    grid: dict[str, list[int]] = field(default_factory=dict)  # axis name -> measured values
    num_gpu_blocks: dict[int, int] = field(default_factory=dict)  # block_size -> blocks
    # decode-only steps replayed CUDA graphs at these padded batch sizes, ascending (empty: eager)
    cuda_graph_sizes: list[int] = field(default_factory=list)
    # every other step of at most max(these) tokens replayed a CUDA graph at the smallest of
    # these token counts >= its tokens; empty: eager
    cuda_graph_token_sizes: list[int] = field(default_factory=list)
    # the variable-length attention kernel's query tokens per program and keys per tile
    # (0: not recorded; prefill steps are then priced per entry)
    varlen_block_q: int = 0
    varlen_tile_n: int = 0
    # the split-K decode kernel's context tokens per tile and programs resident per SM (0: not
    # recorded; decode steps are then priced at their mean context alone)
    decode_tile_n: int = 0
    decode_programs_per_sm: int = 0
    # host time a step with prefill entries spends beyond overhead.csv's decode-only time at
    # its batch size: per step, and per prefill entry (ms; None: not measured, no extra)
    overhead_prefill_step_ms: float | None = None
    overhead_per_prefill_ms: float | None = None
    gpu_memory_utilization: float | None = None
    host_link_bytes_per_s: float | None = None  # measured pinned copy rate (swap costs)
    device: dict[str, Any] = field(default_factory=dict)  # SM count, clocks, memory, ...
    method: str = ""  # timing method: events, warm-up, repeats
    synthetic: bool = False  # True only for test fixtures: never a measurement
    notes: str = ""
    # a merged profile (`pagesim.cost.profile_merge`): each source calibration's step-time
    # level against this profile's, in the order `notes` lists their dates (None: one
    # calibration, no spread measured). Optional in every format version: written only when
    # known, so a profile without it is byte for byte what it was.
    source_scales: list[float] | None = None
    format_version: int = PROFILE_FORMAT_VERSION

    def __post_init__(self) -> None:
        self.check(PROFILE_JSON)

    @property
    def kv_heads_per_gpu(self) -> int | None:
        """KV heads of the measured model on each GPU (the attention kernels' grids are
        sized by them); None for a model pagesim does not know."""
        spec = shipped_spec(self.model)
        if spec is None:
            return None
        return max(1, spec.num_kv_heads // self.tensor_parallel_size)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["num_gpu_blocks"] = {str(k): v for k, v in self.num_gpu_blocks.items()}
        if self.source_scales is None:
            del out["source_scales"]
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> ProfileMetadata:
        if not isinstance(data, dict):
            raise ProfileError(f"{where}: expected a JSON object")
        version = data.get("format_version")
        if type(version) is not int or version != PROFILE_FORMAT_VERSION:
            older = type(version) is int and 1 <= version < PROFILE_FORMAT_VERSION
            hint = f"; convert it with `pagesim migrate-profile {Path(where).parent}`"
            raise ProfileError(
                f"{where}: format_version={version!r} is not supported (this pagesim reads "
                f"{PROFILE_FORMAT_VERSION}){hint if older else ''}"
            )
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ProfileError(f"{where}: unknown key {key!r}")
        missing = [
            f.name
            for f in fields(cls)
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING
        ]
        if missing:
            raise ProfileError(f"{where}: missing key {missing[0]!r}")
        kw = dict(data)
        try:
            kw["grid"] = {str(k): [int(v) for v in vs] for k, vs in kw.get("grid", {}).items()}
            kw["num_gpu_blocks"] = {int(k): int(v) for k, v in kw.get("num_gpu_blocks", {}).items()}
            for key in ("cuda_graph_sizes", "cuda_graph_token_sizes"):
                kw[key] = [int(v) for v in kw.get(key, [])]
        except (TypeError, ValueError, AttributeError) as e:
            raise ProfileError(
                f"{where}: grid/num_gpu_blocks/cuda_graph_sizes/"
                f"cuda_graph_token_sizes must map to integers ({e})"
            ) from None
        try:
            return cls(**kw)
        except ProfileError as e:  # re-anchor the message on the file's path
            raise ProfileError(f"{where}: {str(e).split(': ', 1)[1]}") from None

    def check(self, where: str) -> None:
        """Type and range checks, one line naming the first bad key."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and not isinstance(value, str):
                raise ProfileError(f"{where}: {f.name}={value!r} must be a string")
        for name in ("gpu", "model"):
            if not getattr(self, name):
                raise ProfileError(f"{where}: {name} must not be empty")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ProfileError(
                f"{where}: tensor_parallel_size={self.tensor_parallel_size!r} "
                "must be an integer >= 1"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ProfileError(
                f"{where}: kv_cache_dtype={self.kv_cache_dtype!r} is not one of "
                f"{', '.join(KV_CACHE_DTYPES)}"
            )
        if not isinstance(self.device, dict):
            raise ProfileError(f"{where}: device={self.device!r} must be an object")
        for name in ("synthetic", "allreduce_in_step_times"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ProfileError(f"{where}: {name}={value!r} must be true or false")
        if not self.allreduce_in_step_times and self.tensor_parallel_size == 1:
            raise ProfileError(
                f"{where}: allreduce_in_step_times=false needs "
                "tensor_parallel_size > 1 (one GPU has no all-reduce)"
            )
        for name in ("cuda_graph_sizes", "cuda_graph_token_sizes"):
            sizes = getattr(self, name)
            if (
                not isinstance(sizes, list)
                or any(not isinstance(v, int) or v < 1 for v in sizes)
                or sizes != sorted(set(sizes))
            ):
                raise ProfileError(
                    f"{where}: {name}={sizes!r} must be ascending distinct integers >= 1"
                )
        for name in ("varlen_block_q", "varlen_tile_n", "decode_tile_n", "decode_programs_per_sm"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ProfileError(f"{where}: {name}={value!r} must be an integer >= 0")
        for name in ("gpu_memory_utilization", "host_link_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int | float) or not value > 0):
                raise ProfileError(f"{where}: {name}={value!r} must be a positive number")
        scales = self.source_scales
        if scales is not None and (
            not isinstance(scales, list)
            or not scales
            or any(
                isinstance(v, bool)
                or not isinstance(v, int | float)
                or not math.isfinite(v)
                or not v > 0
                for v in scales
            )
        ):
            raise ProfileError(
                f"{where}: source_scales={scales!r} must be a non-empty list of numbers > 0"
            )


@dataclass(frozen=True)
class Profile:
    """Metadata plus the measured tables; rows are kept in the order they were recorded."""

    metadata: ProfileMetadata
    decode: tuple[DecodeRow, ...]
    prefill: tuple[PrefillRow, ...]
    mixed: tuple[MixedRow, ...] = ()
    overhead: tuple[OverheadRow, ...] = ()
    allreduce: tuple[AllReduceRow, ...] = ()
    multi_prefill: tuple[MultiPrefillRow, ...] = ()
    decode_shared: tuple[DecodeSharedRow, ...] = ()
    varlen_shared: tuple[VarlenSharedRow, ...] = ()
    decode_spread: tuple[DecodeSpreadRow, ...] = ()
    decode_shared_spread: tuple[DecodeSharedSpreadRow, ...] = ()

    def __post_init__(self) -> None:
        for name, (row_cls, required) in TABLES.items():
            rows = getattr(self, name)
            object.__setattr__(self, name, tuple(rows))
            if required and not rows:
                raise ProfileError(f"{name}.csv: no rows (the {name} table is required)")
            _check_rows(name, row_cls, getattr(self, name))

    @property
    def block_sizes(self) -> list[int]:
        """Block sizes with decode rows, ascending."""
        return sorted({r.block_size for r in self.decode})

    def replace_tables(self, **tables: tuple) -> Profile:
        """A copy with some tables replaced (used to fit on a subset of rows)."""
        kw = {name: getattr(self, name) for name in TABLES}
        kw.update(tables)
        return Profile(self.metadata, **kw)

    def save(self, directory: str | Path) -> Path:
        """Write profile.json and one CSV per non-empty table; returns the directory."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / PROFILE_JSON, "w", encoding="utf-8") as f:
            json.dump(self.metadata.to_json(), f, indent=2, sort_keys=True)
            f.write("\n")
        for name, (row_cls, _) in TABLES.items():
            rows = getattr(self, name)
            target = path / f"{name}.csv"
            if not rows:
                target.unlink(missing_ok=True)
                continue
            cols = [f.name for f in fields(row_cls)]
            with open(target, "w", encoding="utf-8", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(cols)
                for r in rows:
                    w.writerow([repr(getattr(r, c)) for c in cols])
        return path

    @staticmethod
    def load_metadata(directory: str | Path) -> ProfileMetadata:
        """A profile directory's `profile.json`, validated, without reading its tables (for
        callers that need only what was measured where and when)."""
        return ProfileMetadata.from_json(
            read_profile_json(directory), str(Path(directory) / PROFILE_JSON)
        )

    @classmethod
    def load(cls, directory: str | Path) -> Profile:
        """Read and validate a profile directory written by `save` (or by hand)."""
        profile = cls(cls.load_metadata(directory), **load_tables(directory))
        _check_grid(Path(directory), profile.decode)
        return profile


def read_profile_json(directory: str | Path) -> Any:
    """The parsed `profile.json` of a profile directory, not yet validated."""
    meta_path = Path(directory) / PROFILE_JSON
    if not Path(directory).is_dir():
        raise ProfileError(f"{directory}: no such calibration profile directory")
    if not meta_path.is_file():
        raise ProfileError(f"{meta_path}: no such calibration profile")
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ProfileError(f"{meta_path}: not valid JSON ({e})") from None


def load_tables(directory: str | Path) -> dict[str, tuple]:
    """A profile directory's tables by name (absent optional ones empty), each row checked."""
    path = Path(directory)
    tables: dict[str, tuple] = {}
    for name, (row_cls, required) in TABLES.items():
        csv_path = path / f"{name}.csv"
        if not csv_path.is_file():
            if required:
                raise ProfileError(f"{csv_path}: missing (the {name} table is required)")
            tables[name] = ()
            continue
        tables[name] = _read_table(csv_path, row_cls)
    _check_measured(path, tables)
    return tables


def profile_dir(root: str | Path, gpu: str, model: str, tensor_parallel_size: int = 1) -> Path:
    """Where a profile for (gpu, model) lives under a calibration root: `<gpu>/<model>`, or
    `<gpu>/<model>-tp<N>` for a tensor-parallel profile."""
    name = model if tensor_parallel_size == 1 else f"{model}-tp{tensor_parallel_size}"
    return Path(root) / gpu / name


def _read_table(path: Path, row_cls: type) -> tuple:
    cols = [(f.name, int if f.type == "int" else float) for f in fields(row_cls)]
    try:
        return _read_rows(path, row_cls, cols)
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not UTF-8 text (a CSV table was expected)") from None
    except csv.Error as e:
        raise ProfileError(f"{path}: malformed CSV ({e})") from None


def _read_rows(path: Path, row_cls: type, cols: Sequence[tuple[str, type]]) -> tuple:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ProfileError(f"{path}: empty file (expected a header row)")
        header = [h.strip() for h in header]
        for name, _ in cols:
            if name not in header:
                raise ProfileError(f"{path}: missing column {name!r}")
        index = [header.index(name) for name, _ in cols]
        rows = []
        for line_no, raw in enumerate(reader, start=2):
            if not raw or all(not x.strip() for x in raw):
                continue
            if len(raw) != len(header):
                raise ProfileError(
                    f"{path} line {line_no}: {len(raw)} fields, header has {len(header)}"
                )
            values = [
                _parse(path, line_no, name, kind, raw[i].strip())
                for (name, kind), i in zip(cols, index, strict=True)
            ]
            rows.append(row_cls(*values))
    return tuple(rows)


def _check_measured(path: Path, tables: dict[str, tuple]) -> None:
    """What a measured table must hold to price a step: step times > 0 (a time of zero
    would divide a cost by zero)."""
    for name, rows in tables.items():
        for i, r in enumerate(rows):
            t = getattr(r, "step_time_ms", None)
            if t is not None and not t > 0:
                raise ProfileError(f"{path / name}.csv row {i + 1}: step_time_ms={t!r} must be > 0")


def _parse(path: Path, line_no: int, name: str, kind: type, text: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ProfileError(f"{path} line {line_no}: {name}={text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise ProfileError(f"{path} line {line_no}: {name}={text!r} is not finite")
    return value


def _check_rows(table: str, row_cls: type, rows: tuple) -> None:
    """Sizes >= 1 (contexts >= 0), times >= 0, no duplicate grid point."""
    names = [f.name for f in fields(row_cls)]
    n_keys = KEY_COLUMNS[table]
    seen: set[tuple] = set()
    for i, r in enumerate(rows):
        if not isinstance(r, row_cls):
            raise ProfileError(f"{table}.csv row {i + 1}: expected {row_cls.__name__}")
        key = tuple(getattr(r, n) for n in names[:n_keys])
        for n, v in zip(names[:n_keys], key, strict=True):
            # a decode context is never empty; a shared-prefix step may have no decodes
            low = 0 if n in ("num_cached_tokens", "num_decodes", "decode_context_len") else 1
            if not isinstance(v, int) or v < low:
                raise ProfileError(
                    f"{table}.csv row {i + 1}: {n}={v!r} must be an integer >= {low}"
                )
        for n in names[n_keys:]:
            v = getattr(r, n)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                raise ProfileError(
                    f"{table}.csv row {i + 1}: {n}={v!r} must be a finite number >= 0"
                )
        if key in seen:
            point = ", ".join(f"{n}={v}" for n, v in zip(names[:n_keys], key, strict=True))
            raise ProfileError(f"{table}.csv row {i + 1}: duplicate grid point {point}")
        seen.add(key)


def _check_grid(directory: Path, decode: tuple[DecodeRow, ...]) -> None:
    """The model interpolates over a measured grid, so each block size needs two decode
    points at least. A profile on disk with one is a truncated or hand-cut table, and would
    price every decode step from that one point. (Profiles built in memory, such as a fit's
    subset of rows, are not held to this; the smallest calibration grid, a dry run's, has two.)"""
    counts: dict[int, int] = {}
    for r in decode:
        counts[r.block_size] = counts.get(r.block_size, 0) + 1
    for bs, n in sorted(counts.items()):
        if n < 2:
            raise ProfileError(
                f"{directory / 'decode.csv'}: block_size={bs} has one row; a profile measures "
                "a grid (two decode points at least)"
            )
