"""Engine and load options shared by `run`, `sweep` and `plan`, with vLLM's flag names.

Every option defaults to None ("not given") so that the precedence is vLLM's:
command line > `--config FILE.yaml` > defaults resolved by `EngineConfig.create`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from pagesim.config import EngineConfig
from pagesim.cost.corrections import CORRECTIONS
from pagesim.errors import ConfigError
from pagesim.metrics.report import LATENCY_METRICS
from pagesim.sim.simulate import LoadSpec

ENGINE = "Engine (vllm serve flags)"
LOAD = "Load (vllm bench serve flags)"

# ---- engine ----
Model = Annotated[
    str | None, typer.Option(help="Model name, e.g. llama-2-7b.", rich_help_panel=ENGINE)
]
Gpu = Annotated[str | None, typer.Option(help="GPU name, e.g. h200.", rich_help_panel=ENGINE)]
BlockSize = Annotated[
    int | None, typer.Option(help="Tokens per KV block [16].", rich_help_panel=ENGINE)
]
GpuMemUtil = Annotated[float | None, typer.Option(help="[0.92]", rich_help_panel=ENGINE)]
NumBlocksOverride = Annotated[int | None, typer.Option(rich_help_panel=ENGINE)]
KVCacheMemoryBytes = Annotated[
    int | None,
    typer.Option(
        help="KV cache size in bytes, as vLLM's flag: overrides --gpu-memory-utilization",
        rich_help_panel=ENGINE,
    ),
]
MaxNumSeqs = Annotated[
    int | None, typer.Option(help="[GPU-dependent, as vLLM]", rich_help_panel=ENGINE)
]
MaxBatchedTokens = Annotated[
    int | None, typer.Option(help="[GPU-dependent, as vLLM]", rich_help_panel=ENGINE)
]
MaxModelLen = Annotated[int | None, typer.Option(help="[the model's]", rich_help_panel=ENGINE)]
PrefixCaching = Annotated[
    bool | None,
    typer.Option(
        "--enable-prefix-caching/--no-enable-prefix-caching", help="[on]", rich_help_panel=ENGINE
    ),
]
ChunkedPrefill = Annotated[
    bool | None,
    typer.Option(
        "--enable-chunked-prefill/--no-enable-chunked-prefill", help="[on]", rich_help_panel=ENGINE
    ),
]
LongPrefill = Annotated[int | None, typer.Option(rich_help_panel=ENGINE)]
PreemptionMode = Annotated[
    str | None,
    typer.Option(
        help="recompute (vLLM v1) | swap (legacy V0 model) [recompute]", rich_help_panel=ENGINE
    ),
]
SwapSpace = Annotated[
    float | None, typer.Option(help="CPU swap GiB per GPU [4]", rich_help_panel=ENGINE)
]
Policy = Annotated[str | None, typer.Option(help="fcfs | priority [fcfs]", rich_help_panel=ENGINE)]
AllocatorOpt = Annotated[
    str | None,
    typer.Option(help="paged | reserve-max | pow2 | oracle [paged]", rich_help_panel=ENGINE),
]
Placement = Annotated[
    str | None,
    typer.Option(
        help="buddy | first-fit (contiguous only) [first-fit for oracle, else buddy]",
        rich_help_panel=ENGINE,
    ),
]
DisableHybridKVCacheManager = Annotated[
    bool | None,
    typer.Option(
        help="Serve a hybrid model's sliding-window layers as full attention, every layer "
        "in one KV cache group, as vLLM's flag (no effect on other models) [off]",
        rich_help_panel=ENGINE,
    ),
]
KVDtype = Annotated[str | None, typer.Option(help="auto | fp8 [auto]", rich_help_panel=ENGINE)]
TP = Annotated[int | None, typer.Option(help="[1]", rich_help_panel=ENGINE)]
VllmCompat = Annotated[
    str | None,
    typer.Option(
        help="vLLM release whose KV/scheduler behaviour to follow: 0.33 | 0.23 [0.33]",
        rich_help_panel=ENGINE,
    ),
]
ProfileOpt = Annotated[
    Path | None,
    typer.Option(
        help="Calibration profile directory [the shipped H200 profile when it matches]",
        rich_help_panel=ENGINE,
    ),
]
StepTimeScale = Annotated[
    float,
    typer.Option(
        help="Price every step this many times the cost model's time: 1.03 plans for a GPU "
        "session 3 % slower than the profile's (calibrations of one setup differ by a few "
        "%) [1.0]",
        rich_help_panel=ENGINE,
    ),
]
DisableCorrection = Annotated[
    list[str] | None,
    typer.Option(
        help="Leave this correction of the calibrated cost model off (repeatable; names as "
        f"`pagesim fit-report` lists them: {', '.join(CORRECTIONS)}).",
        rich_help_panel=ENGINE,
    ),
]

# ---- load ----
WorkloadOpt = Annotated[
    str | None,
    typer.Option(
        "--workload",
        "--dataset-name",
        help="Shipped name (sharegpt = chat), YAML spec, trace file or mix chat:0.7+code:0.3 "
        "[chat]",
        rich_help_panel=LOAD,
    ),
]
NumPrompts = Annotated[int | None, typer.Option(help="[1000]", rich_help_panel=LOAD)]
RequestRate = Annotated[
    float | None,
    typer.Option(
        help="req/s; inf = all at once [the workload's own arrivals]", rich_help_panel=LOAD
    ),
]
Burstiness = Annotated[float | None, typer.Option(help="[1.0 = Poisson]", rich_help_panel=LOAD)]
MaxConcurrency = Annotated[int | None, typer.Option(rich_help_panel=LOAD)]
Seed = Annotated[int | None, typer.Option(help="[0]", rich_help_panel=LOAD)]
RandomInputLen = Annotated[int | None, typer.Option(rich_help_panel=LOAD)]
RandomOutputLen = Annotated[int | None, typer.Option(rich_help_panel=LOAD)]
RandomRangeRatio = Annotated[float | None, typer.Option(rich_help_panel=LOAD)]
RandomPrefixLen = Annotated[int | None, typer.Option(rich_help_panel=LOAD)]
Goodput = Annotated[
    list[str] | None,
    typer.Option(
        help="SLO as KEY:MS (ttft, tpot, e2el), repeatable, as vllm bench", rich_help_panel=LOAD
    ),
]
MetricPercentiles = Annotated[
    str | None, typer.Option(help="Comma list [99]", rich_help_panel=LOAD)
]
PercentileMetrics = Annotated[
    str | None,
    typer.Option(
        help="Metrics the printed block shows, comma list of ttft, tpot, itl, e2el (the JSON "
        "keeps all) [all four]",
        rich_help_panel=LOAD,
    ),
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", help="YAML with the same names; flags override it")
]

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}
LOAD_FIELDS = {f.name for f in dataclasses.fields(LoadSpec)}
FILE_ONLY = {"profile", "goodput", "metric_percentiles"}


def read_config_file(path: Path | None) -> dict[str, Any]:
    """`--config` YAML as snake_case keys; unknown keys are an error naming them."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ConfigError(f"--config {path}: cannot read ({why})") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        where = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"--config {path}: malformed YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of settings")
    out = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(out) - ENGINE_FIELDS - LOAD_FIELDS - FILE_ONLY)
    if unknown:
        raise ConfigError(f"--config {path}: unknown setting(s) {', '.join(unknown)}")
    return {k: _typed(path, k, v) for k, v in out.items()}


# The type each scalar setting has on the command line (`int | None` fields: int).
_KINDS: dict[str, type] = {
    f.name: kind
    for f in (*dataclasses.fields(EngineConfig), *dataclasses.fields(LoadSpec))
    if (
        kind := {"int": int, "float": float, "bool": bool, "str": str}.get(
            str(f.type).replace(" | None", "").strip()
        )
    )
    is not None
} | {"profile": str}
_KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _typed(path: Path, key: str, value: Any) -> Any:
    """A file value as the flag would parse it, or a one-line error naming it.

    YAML reads `vllm_compat: 0.23` as a float and `1e3` as a string; both mean what the same
    text means on the command line.
    """
    kind = _KINDS.get(key)
    if kind is None or value is None:
        return value
    if kind is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    if kind is bool and isinstance(value, bool):
        return value
    if kind in (int, float) and not isinstance(value, bool):
        if isinstance(value, int) or (kind is float and isinstance(value, float)):
            return kind(value)
        if isinstance(value, str):
            try:
                return kind(value.strip())
            except ValueError:
                pass
    raise ConfigError(f"--config {path}: {key}={value!r}: expected {_KIND_WORDS[kind]}")


def merge(file_values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Flags given on the command line win over the file."""
    merged = dict(file_values)
    merged.update({k: v for k, v in flags.items() if v is not None})
    return merged


def engine_config(values: dict[str, Any]) -> EngineConfig:
    """The engine of one run or plan; a placement given with the paged allocator is refused
    (it would be silently ignored)."""
    config = EngineConfig.create(**{k: v for k, v in values.items() if k in ENGINE_FIELDS})
    if values.get("contiguous_placement") is not None and config.allocator == "paged":
        raise ConfigError(
            f"--contiguous-placement {config.contiguous_placement}: applies to the contiguous "
            "allocators (reserve-max, pow2, oracle), not --allocator paged"
        )
    return config


def parse_goodput(items: list[str] | dict | None) -> tuple[tuple[str, float], ...]:
    """`ttft:500 tpot:50` (vllm bench) -> (("ttft", 500.0), ("tpot", 50.0))."""
    if not items:
        return ()
    if isinstance(items, dict):
        items = [f"{k}:{v}" for k, v in items.items()]
    elif isinstance(items, str):
        items = [items]
    elif not isinstance(items, list):
        raise ConfigError(f"--goodput {items!r}: expected ttft:MS, tpot:MS or e2el:MS")
    out = []
    for item in items:
        for part in str(item).split():
            key, sep, value = part.partition(":")
            if not sep or key not in ("ttft", "tpot", "e2el"):
                raise ConfigError(f"--goodput {part!r}: expected ttft:MS, tpot:MS or e2el:MS")
            try:
                out.append((key, float(value)))
            except ValueError:
                raise ConfigError(f"--goodput {part!r}: {value!r} is not a number") from None
    return tuple(out)


def parse_percentiles(text: str | list | None) -> tuple[float, ...]:
    if text is None:
        return (99,)
    parts = text if isinstance(text, list) else str(text).split(",")
    try:
        return tuple(float(p) for p in parts if str(p).strip())
    except ValueError:
        raise ConfigError(
            f"--metric-percentiles {text!r}: expected numbers like 50,90,99"
        ) from None


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    """`--percentile-metrics ttft,tpot` -> ("ttft", "tpot"); None: all four."""
    if text is None:
        return LATENCY_METRICS
    names = tuple(p.strip() for p in str(text).split(",") if p.strip())
    bad = [n for n in names if n not in LATENCY_METRICS]
    if bad or not names:
        raise ConfigError(
            f"--percentile-metrics {text!r}: expected a comma list of {', '.join(LATENCY_METRICS)}"
        )
    return tuple(n for n in LATENCY_METRICS if n in names)


def load_spec(values: dict[str, Any]) -> LoadSpec:
    kwargs = {k: v for k, v in values.items() if k in LOAD_FIELDS}
    rate = kwargs.get("request_rate")
    if isinstance(rate, str):
        kwargs["request_rate"] = math.inf if rate.strip().lower() == "inf" else float(rate)
    kwargs["goodput_slos_ms"] = parse_goodput(values.get("goodput"))
    kwargs["percentiles"] = parse_percentiles(values.get("metric_percentiles"))
    return LoadSpec(**kwargs)
