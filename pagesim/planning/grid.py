"""Sweep grids: engine and load settings, their Cartesian product, and the points' names.

Settings come from three places, as `vllm bench sweep serve` takes them:

- comma lists on the command line (`--block-size 8,16,32 --request-rate 2,4,8`): one axis
  per flag, all axes multiplied;
- parameter files (`--engine-params` / `--load-params`, also spelt `--serve-params` /
  `--bench-params`): JSON or YAML lists of dicts, each dict one combination; the files'
  entries multiply with each other and with the axes;
- `--config FILE.yaml`: fixed settings under everything else.

A setting given both as an axis and in a parameter file is an error (one line). Names are
EngineConfig's and LoadSpec's fields (vLLM's), plus `profile` (a calibration directory, or
`analytical`). Order: engine entries and axes outer, load inner, each in the order given, so
point indices and names are stable. A point's name lists the settings that vary across the
grid: `ENGINE-block_size=16-LOAD-request_rate=4` (`default` when nothing varies).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError, PagesimError
from pagesim.kvcache.sizing import kv_capacity
from pagesim.planning.mix import check_workload, is_mix, mix_name
from pagesim.sim.simulate import LoadSpec

MAX_POINTS = 100_000  # grid points of one sweep
MAX_NAME_CHARS = 200  # a point's folder name; longer ones are hashed
ENGINE_KEYS: tuple[str, ...] = (*(f.name for f in dataclasses.fields(EngineConfig)), "profile")
LOAD_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(LoadSpec) if f.name not in ("percentiles", "goodput_slos_ms")
)


def _kinds(cls: type) -> dict[str, tuple[type, bool]]:
    """field -> (base type, accepts None), from the dataclass annotations."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        base = next(a for a in args if a is not type(None))
        out[name] = (base, type(None) in args)
    return out


KINDS: dict[str, tuple[type, bool]] = {
    **_kinds(EngineConfig),
    **_kinds(LoadSpec),
    "profile": (str, True),
}


def coerce(key: str, value: Any) -> Any:
    """A setting's value in its field's type; strings are parsed (`inf`, `none`, `true`)."""
    if key not in ENGINE_KEYS and key not in LOAD_KEYS:
        raise ConfigError(f"sweep: unknown setting {key!r}")
    base, optional = KINDS[key]
    where = f"sweep: {key}={value!r}"
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{where}: a value is required")
    if isinstance(value, str):
        value = value.strip()
        if not value:
            raise ConfigError(f"{where}: empty value")
    if base is bool:
        if isinstance(value, bool):
            return value
        low = str(value).lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{where}: expected true or false")
    if base in (int, float):
        expected = f"{where}: expected {'an integer' if base is int else 'a number'}"
        fraction = base is int and isinstance(value, float) and not value.is_integer()
        if isinstance(value, bool) or fraction:
            raise ConfigError(expected)
        try:
            return base(value)
        except ValueError:
            raise ConfigError(expected) from None
    return str(value)


def parse_axis(key: str, text: str) -> list[Any]:
    """`8,16,32` -> [8, 16, 32] in the field's type."""
    items = [t for t in str(text).split(",")]
    if any(not t.strip() for t in items):
        raise ConfigError(f"sweep: --{key.replace('_', '-')} {text!r}: empty item in the list")
    return [coerce(key, t) for t in items]


def read_param_file(path: Path | str, kind: str) -> list[dict[str, Any]]:
    """A JSON or YAML list of dicts (one dict alone is a list of one), keys snake or kebab."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"--{kind}-params {p}: cannot read the file as UTF-8 text") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError):
        raise ConfigError(
            f"--{kind}-params {p}: malformed {'JSON' if p.suffix == '.json' else 'YAML'}"
        ) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) for d in data):
        raise ConfigError(f"--{kind}-params {p}: expected a non-empty list of mappings")
    allowed = ENGINE_KEYS if kind == "engine" else LOAD_KEYS
    out = []
    for entry in data:
        row = {}
        for k, v in entry.items():
            key = str(k).replace("-", "_")
            if key not in allowed:
                raise ConfigError(f"--{kind}-params {p}: {key!r} is not a {kind} setting")
            row[key] = coerce(key, v)
        out.append(row)
    return out


@dataclass(frozen=True)
class SweepPoint:
    """One combination of settings; `settings` holds every given setting (base included)."""

    index: int
    name: str
    settings: dict[str, Any]

    @property
    def engine(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings.items() if k in ENGINE_KEYS and k != "profile"}

    @property
    def load(self) -> dict[str, Any]:
        return {k: v for k, v in self.settings.items() if k in LOAD_KEYS}

    @property
    def profile(self) -> str | None:
        return self.settings.get("profile")

    def engine_config(self) -> EngineConfig:
        return EngineConfig.create(**self.engine)

    def load_spec(
        self,
        percentiles: tuple[float, ...] = (99,),
        goodput_slos_ms: tuple[tuple[str, float], ...] = (),
    ) -> LoadSpec:
        defaults = {"workload": "chat", "num_prompts": 1000}
        return LoadSpec(
            **{**defaults, **self.load}, percentiles=percentiles, goodput_slos_ms=goodput_slos_ms
        )


@dataclass(frozen=True)
class SweepGrid:
    points: tuple[SweepPoint, ...]
    varying: tuple[str, ...]  # settings that differ between points, in name order

    def __len__(self) -> int:
        return len(self.points)


def _combos(entries: list[dict[str, Any]], axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(axes)
    return [
        {**entry, **dict(zip(keys, values, strict=True))}
        for entry in entries
        for values in itertools.product(*(axes[k] for k in keys))
    ]


def build_grid(
    axes: dict[str, list[Any]],
    *,
    base: dict[str, Any] | None = None,
    engine_params: list[dict[str, Any]] | None = None,
    load_params: list[dict[str, Any]] | None = None,
) -> SweepGrid:
    """The Cartesian grid; every point's config and load are validated (one-line errors)."""
    base = {k: coerce(k, v) for k, v in (base or {}).items()}
    for key, values in axes.items():
        if not values:
            raise ConfigError(f"sweep: --{key.replace('_', '-')}: empty list")
        for entries, kind in ((engine_params, "engine"), (load_params, "load")):
            if entries and any(key in e for e in entries):
                raise ConfigError(
                    f"sweep: {key} is given both as a flag and in --{kind}-params;"
                    " give it in one place"
                )
    engine_axes = {k: v for k, v in axes.items() if k in ENGINE_KEYS}
    load_axes = {k: v for k, v in axes.items() if k in LOAD_KEYS}
    unknown = sorted(set(axes) - set(engine_axes) - set(load_axes))
    if unknown:
        raise ConfigError(f"sweep: unknown setting {unknown[0]!r}")
    _check_grid_size(engine_params, engine_axes, load_params, load_axes)
    engines = _combos(engine_params or [{}], engine_axes)
    loads = _combos(load_params or [{}], load_axes)
    combos = [{**base, **e, **ld} for e in engines for ld in loads]
    order = [k for k in (*ENGINE_KEYS, *LOAD_KEYS) if any(k in c for c in combos)]
    varying = tuple(
        k for k in order if len({json.dumps(c.get(k), default=str) for c in combos}) > 1
    )
    names = _unique([point_name(c, varying) for c in combos])
    points = tuple(SweepPoint(i, n, c) for i, (n, c) in enumerate(zip(names, combos, strict=True)))
    for p in points:
        _validate(p)
    return SweepGrid(points, varying)


def _check_grid_size(engine_params, engine_axes, load_params, load_axes) -> None:
    """Count the points before building any, and refuse a grid too large to run."""
    sizes = [len(engine_params or [{}]), len(load_params or [{}])]
    sizes += [len(v) for v in (*engine_axes.values(), *load_axes.values())]
    count = math.prod(sizes)
    if count > MAX_POINTS:
        raise ConfigError(
            f"sweep: {count:,} points ({' x '.join(str(n) for n in sizes if n > 1)}); "
            f"at most {MAX_POINTS:,}: split the sweep"
        )


def _validate(point: SweepPoint) -> None:
    """Refuse a point before any run as `pagesim run` would refuse it: its settings, its
    load, and its KV cache sizing (weights that do not fit, no block left, ...)."""
    try:
        kv_capacity(point.engine_config())
        point.load_spec()
        check_workload(point.load.get("workload", "chat"))
    except PagesimError as exc:
        raise ConfigError(f"sweep point {point.name}: {exc}") from None


def _value_text(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    if isinstance(value, str) and key in ("workload", "profile"):
        if is_mix(value):
            return mix_name(value)
        return Path(value).name.split(".")[0] or value  # a file: its stem
    return str(value)


def point_name(settings: dict[str, Any], varying: tuple[str, ...]) -> str:
    """ENGINE-k=v-...-LOAD-k=v-... over the varying settings, file-name safe."""
    parts = []
    for section, keys in (("ENGINE", ENGINE_KEYS), ("LOAD", LOAD_KEYS)):
        items = [f"{k}={_value_text(k, settings.get(k))}" for k in varying if k in keys]
        if items:
            parts.append("-".join([section, *items]))
    name = re.sub(r"[^A-Za-z0-9._=+-]", "_", "-".join(parts) or "default")
    if len(name) > MAX_NAME_CHARS:  # too long for a folder: a short hash (sweep.json maps it)
        return "point-" + hashlib.sha256(name.encode()).hexdigest()[:16]
    return name


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out
