"""Engine and load options shared by `run`, `sweep` and `plan`, with vLLM's flag names.

Every option defaults to None ("not given") so that the precedence is vLLM's:
command line > `--config FILE.yaml` > defaults resolved by `EngineConfig.create`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
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


def panel_option(panel: str, help: str | None = None, *names: str, **extra: Any) -> Any:
    """An option listed under `panel` in `--help`: the help text, its names when not the
    parameter's, and any other `typer.Option` setting."""
    return typer.Option(*names, help=help, rich_help_panel=panel, **extra)


def engine_option(help: str | None = None, *names: str, **extra: Any) -> Any:
    """An engine option (vllm serve's flag), as `panel_option`."""
    return panel_option(ENGINE, help, *names, **extra)


def load_option(help: str | None = None, *names: str) -> Any:
    """A load option (vllm bench serve's flag), as `panel_option`."""
    return panel_option(LOAD, help, *names)


# ---- engine ----
Model = Annotated[str | None, engine_option("Model name, e.g. llama-2-7b.")]
Gpu = Annotated[str | None, engine_option("GPU name, e.g. h200.")]
BlockSize = Annotated[int | None, engine_option("Tokens per KV block [16].")]
GpuMemUtil = Annotated[float | None, engine_option("[0.92]")]
NumBlocksOverride = Annotated[int | None, engine_option()]
KVCacheMemoryBytes = Annotated[
    int | None,
    engine_option("KV cache size in bytes, as vLLM's flag: overrides --gpu-memory-utilization"),
]
MaxNumSeqs = Annotated[int | None, engine_option("[GPU-dependent, as vLLM]")]
MaxBatchedTokens = Annotated[int | None, engine_option("[GPU-dependent, as vLLM]")]
MaxModelLen = Annotated[int | None, engine_option("[the model's]")]
PrefixCaching = Annotated[
    bool | None, engine_option("[on]", "--enable-prefix-caching/--no-enable-prefix-caching")
]
ChunkedPrefill = Annotated[
    bool | None, engine_option("[on]", "--enable-chunked-prefill/--no-enable-chunked-prefill")
]
LongPrefill = Annotated[int | None, engine_option()]
PreemptionMode = Annotated[
    str | None, engine_option("recompute (vLLM v1) | swap (legacy V0 model) [recompute]")
]
SwapSpace = Annotated[float | None, engine_option("CPU swap GiB per GPU [4]")]
Policy = Annotated[str | None, engine_option("fcfs | priority [fcfs]")]
AllocatorOpt = Annotated[str | None, engine_option("paged | reserve-max | pow2 | oracle [paged]")]
Placement = Annotated[
    str | None,
    engine_option("buddy | first-fit (contiguous only) [first-fit for oracle, else buddy]"),
]
DisableHybridKVCacheManager = Annotated[
    bool | None,
    engine_option(
        "Serve a hybrid model's sliding-window layers as full attention, every layer "
        "in one KV cache group, as vLLM's flag (no effect on other models) [off]"
    ),
]
KVDtype = Annotated[str | None, engine_option("auto | fp8 [auto]")]
TP = Annotated[int | None, engine_option("[1]")]
VllmCompat = Annotated[
    str | None,
    engine_option("vLLM release whose KV/scheduler behaviour to follow: 0.33 | 0.23 [0.33]"),
]
ProfileOpt = Annotated[
    Path | None,
    engine_option(
        "Calibration profile directory [the shipped profile of the model and GPU; for a GPU "
        "with none, the H200's carried over by transfer; else the analytical model]"
    ),
]
StepTimeScale = Annotated[
    float,
    engine_option(
        "Price every step this many times the cost model's time: 1.03 plans for a GPU "
        "session 3 % slower than the profile's (calibrations of one setup differ by a few "
        "%); 0.001 to 1000, far past any real GPU's difference [1.0]",
        show_default=False,  # the help says it, as the other options' do
    ),
]
DisableCorrection = Annotated[
    list[str] | None,
    engine_option(
        "Leave this correction of the calibrated cost model off (repeatable; names as "
        f"`pagesim fit-report` lists them: {', '.join(CORRECTIONS)})."
    ),
]

# ---- load ----
WorkloadOpt = Annotated[
    str | None,
    load_option(
        "Shipped name (sharegpt = chat), YAML spec, trace file or mix chat:0.7+code:0.3 [chat]",
        "--workload",
        "--dataset-name",
    ),
]
NumPrompts = Annotated[int | None, load_option("[1000]")]
RequestRate = Annotated[
    float | None, load_option("req/s; inf = all at once [the workload's own arrivals]")
]
Burstiness = Annotated[float | None, load_option("[1.0 = Poisson]")]
MaxConcurrency = Annotated[int | None, load_option()]
Seed = Annotated[int | None, load_option("[0]")]
RandomInputLen = Annotated[int | None, load_option()]
RandomOutputLen = Annotated[int | None, load_option()]
RandomRangeRatio = Annotated[float | None, load_option()]
RandomPrefixLen = Annotated[int | None, load_option()]
Goodput = Annotated[
    list[str] | None, load_option("SLO as KEY:MS (ttft, tpot, e2el), repeatable, as vllm bench")
]
MetricPercentiles = Annotated[str | None, load_option("Comma list [99]")]
PercentileMetrics = Annotated[
    str | None,
    load_option(
        "Metrics the printed block shows, comma list of ttft, tpot, itl, e2el (the JSON "
        "keeps all) [all four]"
    ),
]
ConfigFile = Annotated[
    Path | None, typer.Option("--config", help="YAML with the same names; flags override it")
]


def engine_options(
    model: Model = None,
    gpu: Gpu = None,
    block_size: BlockSize = None,
    gpu_memory_utilization: GpuMemUtil = None,
    num_gpu_blocks_override: NumBlocksOverride = None,
    kv_cache_memory_bytes: KVCacheMemoryBytes = None,
    max_num_seqs: MaxNumSeqs = None,
    max_num_batched_tokens: MaxBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    enable_prefix_caching: PrefixCaching = None,
    enable_chunked_prefill: ChunkedPrefill = None,
    long_prefill_token_threshold: LongPrefill = None,
    preemption_mode: PreemptionMode = None,
    swap_space: SwapSpace = None,
    scheduling_policy: Policy = None,
    allocator: AllocatorOpt = None,
    contiguous_placement: Placement = None,
    disable_hybrid_kv_cache_manager: DisableHybridKVCacheManager = None,
    kv_cache_dtype: KVDtype = None,
    tensor_parallel_size: TP = None,
    vllm_compat: VllmCompat = None,
    profile: ProfileOpt = None,
) -> None:
    """The engine options of the commands that simulate (`run`, `plan`; `validate` picks some):
    a group for `with_options`, never called."""


def pricing_options(
    step_time_scale: StepTimeScale = 1.0, disable_correction: DisableCorrection = None
) -> None:
    """How `run` and `plan` price steps beyond the engine (a group for `with_options`)."""


def load_options(
    workload: WorkloadOpt = None,
    num_prompts: NumPrompts = None,
    request_rate: RequestRate = None,
    burstiness: Burstiness = None,
    max_concurrency: MaxConcurrency = None,
    seed: Seed = None,
    random_input_len: RandomInputLen = None,
    random_output_len: RandomOutputLen = None,
    random_range_ratio: RandomRangeRatio = None,
    random_prefix_len: RandomPrefixLen = None,
    goodput: Goodput = None,
    metric_percentiles: MetricPercentiles = None,
    percentile_metrics: PercentileMetrics = None,
) -> None:
    """The load options of the commands that simulate, as `engine_options`."""


OptionGroup = Callable[..., None] | Mapping[str, Any]


def with_options(
    *groups: OptionGroup,
    omit: tuple[str, ...] = (),
    override: Mapping[str, Any] | None = None,
    after: str = "config",
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a Typer command the options of `groups`, so that commands sharing an option
    declare it once.

    Typer reads a command's options from its signature: this one is the command's own
    parameters with the groups' spliced in after `after` (their place in `--help`). A group
    is a function whose parameters declare options, or a map of name -> annotation (default
    None). The command takes them as `**flags`, keyed by name; `omit` leaves options out and
    `override` gives an option another annotation (another help text) in its place.
    """
    override = override or {}

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        own = [
            p
            for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.kind is not p.VAR_KEYWORD
        ]
        shared = [
            p.replace(annotation=override.get(p.name, p.annotation))
            for group in groups
            for p in _parameters(group)
            if p.name not in omit
        ]
        at = [p.name for p in own].index(after) + 1
        params = [p.replace(kind=p.KEYWORD_ONLY) for p in (*own[:at], *shared, *own[at:])]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return command

    return decorate


def pick(group: Callable[..., None], *names: str) -> dict[str, Any]:
    """Some options of a group, for a command that takes only those (each defaults to None)."""
    params = inspect.signature(group, eval_str=True).parameters
    return {name: params[name].annotation for name in names}


def _parameters(group: OptionGroup) -> list[inspect.Parameter]:
    if callable(group):
        return list(inspect.signature(group, eval_str=True).parameters.values())
    kind = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(n, kind, default=None, annotation=a) for n, a in group.items()]


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
    return file_values | {k: v for k, v in flags.items() if v is not None}


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
