"""Workload specs: the YAML (or dict) schema, parsed into frozen, validated dataclasses.

    name: chat                      # optional, defaults to the file name
    description: one line
    # exactly one request source:
    trace: traces/x.csv.gz          # replay rows in order, with their timestamps / hash_ids
    lengths:                        # or sample lengths:
      trace: traces/y.csv.gz        #   joint (prompt, output) pairs from a trace's columns
      input: DIST                   #   or two distributions (see lengths.Dist)
      output: DIST
      random: {input_len: 1024, output_len: 128, range_ratio: 0.0, prefix_len: 0}
    mix:                            # or a weighted mix of other workloads (names or files)
      - {workload: chat, weight: 0.7}
    # optional:
    arrival: {process: inf | poisson | gamma | trace, rate: R, burstiness: B, time_scale: S}
    prefix: {groups: G, length: DIST, zipf: 0.0}           # shared system prompts
    sessions: {turns: DIST, think_time_s: DIST, max_context_tokens: N}
    tenants: {count: T, zipf: 0.0}                          # per-tenant cache_salt

Paths are relative to the spec file. Unknown keys and bad values raise `WorkloadError` naming
the key path (`arrival.rate`) and the value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pagesim.errors import WorkloadError
from pagesim.utils import MAX_COUNT
from pagesim.workload.lengths import (
    Dist,
    LengthModel,
    ParametricLengths,
    RandomLengths,
    TraceLengths,
    parse_dist,
)
from pagesim.workload.traces import TraceData, read_trace

ARRIVAL_PROCESSES: tuple[str, ...] = ("inf", "poisson", "gamma", "trace")
TOP_KEYS = (
    "n",
    "name",
    "description",
    "trace",
    "lengths",
    "mix",
    "arrival",
    "prefix",
    "sessions",
    "tenants",
)


@dataclass(frozen=True)
class ArrivalSpec:
    """A workload's own arrival process (used when no --request-rate is given).

    `inf`: all at t=0. `poisson` / `gamma`: `vllm bench serve` inter-arrival gaps at `rate`
    (sessions per second) with `burstiness` (poisson means 1). `trace`: the trace's timestamps
    (seconds from its first request) times `time_scale` (> 1 slows the replay down).
    """

    process: str = "inf"
    rate: float | None = None
    burstiness: float = 1.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.process not in ARRIVAL_PROCESSES:
            raise WorkloadError(
                f"arrival.process = {self.process!r}: expected one of "
                f"{', '.join(ARRIVAL_PROCESSES)}"
            )
        if self.process in ("poisson", "gamma"):
            if self.rate is None or not self.rate > 0:
                raise WorkloadError(
                    f"arrival.rate = {self.rate!r}: must be > 0 for process {self.process!r}"
                )
        if not 1e-3 <= self.burstiness <= 1e3:
            raise WorkloadError(
                f"arrival.burstiness = {self.burstiness!r}: must be in [0.001, 1000]"
            )
        if self.process == "poisson" and self.burstiness != 1.0:
            raise WorkloadError(
                f"arrival.burstiness = {self.burstiness!r}: poisson means 1.0 (use process: gamma)"
            )
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise WorkloadError(f"arrival.time_scale = {self.time_scale!r}: must be > 0")


@dataclass(frozen=True)
class PrefixSpec:
    """`groups` shared system prompts; each session draws one (Zipf weights, 0 = uniform)."""

    groups: int
    length: Dist  # tokens of each group's prefix (one draw per group)
    zipf: float = 0.0


@dataclass(frozen=True)
class SessionSpec:
    """Closed-loop multi-turn sessions: turn k+1 is sent `think_time_s` after turn k finished.

    A session also ends before a turn whose prompt plus output would exceed
    `max_context_tokens`; that turn starts the next session instead.
    """

    turns: Dist
    think_time_s: Dist
    max_context_tokens: int | None = None


@dataclass(frozen=True)
class TenantSpec:
    """`count` tenants, each with its own `cache_salt`; each session draws one."""

    count: int
    zipf: float = 0.0


@dataclass(frozen=True, eq=False)
class MixComponent:
    spec: WorkloadSpec
    weight: float  # share of the requests (normalized over the mix)


@dataclass(frozen=True, eq=False)
class WorkloadSpec:
    """A parsed workload: one request source (trace, lengths or mix) and its options."""

    name: str
    description: str = ""
    trace: TraceData | None = None
    lengths: LengthModel | None = None
    mix: tuple[MixComponent, ...] = ()
    arrival: ArrivalSpec = ArrivalSpec()
    prefix: PrefixSpec | None = None
    sessions: SessionSpec | None = None
    tenants: TenantSpec | None = None
    # Samples per prompt (vLLM's SamplingParams.n): each request is served as n requests of
    # the same prompt, which share its prefix blocks through the prefix cache.
    n: int = 1


Resolver = Callable[[str, Path], WorkloadSpec]  # (name or relative path, base dir) -> spec


def trace_spec(trace: TraceData, name: str) -> WorkloadSpec:
    """The spec of a trace file given directly: replay it with its own timestamps, if any."""
    arrival = ArrivalSpec("trace" if trace.timestamps_s is not None else "inf")
    return WorkloadSpec(
        name=name, description=f"replay of {trace.path}", trace=trace, arrival=arrival
    )


def parse_spec(doc: Any, *, name: str, base_dir: Path, resolve: Resolver) -> WorkloadSpec:
    """Validate a spec document (the YAML's top-level mapping) into a `WorkloadSpec`."""
    m = _mapping(doc, "top level")  # not "workload ...": the loader then names the file
    _known(m, TOP_KEYS, "")
    name = _str(m.get("name", name), "name")
    sources = [k for k in ("trace", "lengths", "mix") if k in m]
    if len(sources) != 1:
        raise WorkloadError(
            f"workload {name!r}: needs exactly one of trace, lengths, mix "
            f"(found {', '.join(sources) or 'none'})"
        )
    trace = lengths = None
    mix: tuple[MixComponent, ...] = ()
    if "trace" in m:
        trace = read_trace(_path(m["trace"], "trace", base_dir))
    elif "lengths" in m:
        lengths = _lengths(m["lengths"], base_dir)
    else:
        mix = _mix(m["mix"], base_dir, resolve)
    timed = trace is not None and trace.timestamps_s is not None
    arrival = _arrival(m.get("arrival"), timed)
    prefix = _prefix(m["prefix"]) if "prefix" in m else None
    sessions = _sessions(m["sessions"]) if "sessions" in m else None
    tenants = _tenants(m["tenants"]) if "tenants" in m else None
    if lengths is None and (prefix or sessions):
        key = "prefix" if prefix else "sessions"
        raise WorkloadError(
            f"{key}: needs a `lengths` source (trace replay and mixes keep "
            f"their rows' or components' own prompts)"
        )
    if isinstance(lengths, RandomLengths) and lengths.prefix_len and prefix:
        raise WorkloadError("prefix: conflicts with lengths.random.prefix_len; use one")
    n = _count(m.get("n", 1), "n")
    if n > 1 and sessions:
        raise WorkloadError(f"n = {n}: parallel sampling of multi-turn sessions is not modelled")
    if any(c.spec.n > 1 for c in mix):
        raise WorkloadError("n: give it on the mix, not on its components")
    description = _str(m.get("description", ""), "description")
    return WorkloadSpec(
        name, description, trace, lengths, mix, arrival, prefix, sessions, tenants, n
    )


def _lengths(obj: Any, base_dir: Path) -> LengthModel:
    m = _mapping(obj, "lengths")
    if "trace" in m:
        _known(m, ("trace", "max_total_tokens"), "lengths")
        t = read_trace(_path(m["trace"], "lengths.trace", base_dir))
        prompt, output = t.prompt_lens, t.output_lens
        if "max_total_tokens" in m:
            # Keep rows that fit a context of this many tokens, as vllm bench's ShareGPT
            # sampler drops sequences longer than the model serves.
            limit = int(_positive(m["max_total_tokens"], "lengths.max_total_tokens"))
            keep = prompt + output <= limit
            if not keep.any():
                raise WorkloadError(f"lengths.max_total_tokens={limit}: no row of {t.path} fits")
            prompt, output = prompt[keep], output[keep]
        return TraceLengths(prompt, output, t.path)
    if "random" in m:
        _known(m, ("random",), "lengths")
        r = _mapping(m["random"], "lengths.random")
        _known(r, ("input_len", "output_len", "range_ratio", "prefix_len"), "lengths.random")
        return RandomLengths(**{k: r[k] for k in r})
    _known(m, ("input", "output"), "lengths")
    for key in ("input", "output"):
        if key not in m:
            raise WorkloadError(
                f"lengths.{key}: missing (lengths needs trace, random, or input and output)"
            )
    return ParametricLengths(
        parse_dist(m["input"], "lengths.input", integer=True),
        parse_dist(m["output"], "lengths.output", integer=True),
    )


def _mix(obj: Any, base_dir: Path, resolve: Resolver) -> tuple[MixComponent, ...]:
    if not isinstance(obj, list) or not obj:
        raise WorkloadError(
            f"mix = {obj!r:.60}: expected a non-empty list of {{workload: NAME, weight: W}}"
        )
    out = []
    for k, item in enumerate(obj):
        c = _mapping(item, f"mix[{k}]")
        _known(c, ("workload", "weight"), f"mix[{k}]")
        ref = _str(c.get("workload"), f"mix[{k}].workload")
        weight = _positive(c.get("weight", 1.0), f"mix[{k}].weight")
        out.append(MixComponent(resolve(ref, base_dir), weight))
    check_mix_weights([f"mix[{k}]" for k, item in enumerate(obj) if "weight" not in item], len(obj))
    return tuple(out)


def check_mix_weights(
    unweighted: list[str], count: int, where: str = "", error: type[Exception] = WorkloadError
) -> None:
    """A mix weighs every component or none (equal shares): a default of 1 beside 0.7 would
    give the unweighted one a silent majority. `unweighted` names the components without a
    weight, `count` is how many there are, `where` prefixes the message (e.g. the mix)."""
    if 0 < len(unweighted) < count:
        raise error(
            f"{where}no weight for {', '.join(unweighted)}; give every component a weight, "
            "or none for equal weights"
        )


def _arrival(obj: Any, timed: bool) -> ArrivalSpec:
    if obj is None:
        return ArrivalSpec("trace" if timed else "inf")
    m = _mapping(obj, "arrival")
    _known(m, ("process", "rate", "burstiness", "time_scale"), "arrival")
    process = m.get("process", "trace" if timed else "inf")
    if process == "trace" and not timed:
        raise WorkloadError("arrival.process = 'trace': the workload has no trace timestamps")
    nums = {
        k: _number(m[k], f"arrival.{k}") for k in ("rate", "burstiness", "time_scale") if k in m
    }
    return ArrivalSpec(process=_str(process, "arrival.process"), **nums)


def _prefix(obj: Any) -> PrefixSpec:
    m = _mapping(obj, "prefix")
    _known(m, ("groups", "length", "zipf"), "prefix")
    if "length" not in m:
        raise WorkloadError("prefix.length: missing")
    return PrefixSpec(
        _count(m.get("groups", 1), "prefix.groups"),
        parse_dist(m["length"], "prefix.length", integer=True),
        _non_negative(m.get("zipf", 0.0), "prefix.zipf"),
    )


def _sessions(obj: Any) -> SessionSpec:
    m = _mapping(obj, "sessions")
    _known(m, ("turns", "think_time_s", "max_context_tokens"), "sessions")
    for key in ("turns", "think_time_s"):
        if key not in m:
            raise WorkloadError(f"sessions.{key}: missing")
    cap = m.get("max_context_tokens")
    return SessionSpec(
        parse_dist(m["turns"], "sessions.turns", integer=True),
        parse_dist(m["think_time_s"], "sessions.think_time_s", integer=False),
        None if cap is None else _count(cap, "sessions.max_context_tokens"),
    )


def _tenants(obj: Any) -> TenantSpec:
    m = _mapping(obj, "tenants")
    _known(m, ("count", "zipf"), "tenants")
    return TenantSpec(
        _count(m.get("count"), "tenants.count"), _non_negative(m.get("zipf", 0.0), "tenants.zipf")
    )


# ---- small validators: each raises one line naming the key path and the value ----


def _mapping(obj: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise WorkloadError(f"{where} = {obj!r:.60}: expected a mapping")
    return obj


def _known(m: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in m:
        if key not in allowed:
            at = f"{where}.{key}" if where else str(key)
            raise WorkloadError(f"{at}: unknown key (allowed: {', '.join(allowed)})")


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v.strip() and where != "description":
        raise WorkloadError(f"{where} = {v!r}: expected a non-empty string")
    return v


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        raise WorkloadError(f"{where} = {v!r}: expected a number")
    return float(v)


def _positive(v: Any, where: str) -> float:
    x = _number(v, where)
    if not (x > 0 and math.isfinite(x)):
        raise WorkloadError(f"{where} = {v!r}: must be > 0")
    return x


def _non_negative(v: Any, where: str) -> float:
    x = _number(v, where)
    if not (x >= 0 and math.isfinite(x)):
        raise WorkloadError(f"{where} = {v!r}: must be >= 0")
    return x


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise WorkloadError(f"{where} = {v!r}: must be an integer >= 1")
    if v > MAX_COUNT:
        raise WorkloadError(f"{where} = {v!r}: must be <= {MAX_COUNT:,}")
    return v


def _path(v: Any, where: str, base_dir: Path) -> Path:
    p = Path(_str(v, where))
    return p if p.is_absolute() else base_dir / p
