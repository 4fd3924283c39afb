"""Workloads: shipped specs, YAML specs and trace files, sampled into request plans.

    from pagesim.workload import load_workload
    plan = load_workload("chat").sample(num_prompts=1000, seed=0)
    plan.prompt_lens, plan.output_lens          # int64 [1000]
    request = plan.make_request(0, arrival_time=0.0)   # prompt tokens made here, lazily

`load_workload` takes a shipped name (`shipped_workloads()`), a YAML spec path, or a trace
file (.csv Azure/Vidur, .jsonl Mooncake, optionally .gz). The project reads only the files
shipped inside the package (`pagesim.data.workloads_dir()`). Arrival times are resolved by
`pagesim.sim.arrivals`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from pagesim.data import workloads_dir
from pagesim.errors import WorkloadError, unknown_name
from pagesim.workload.build import Workload
from pagesim.workload.lengths import RandomLengths
from pagesim.workload.plan import RequestPlan
from pagesim.workload.spec import WorkloadSpec, parse_spec, trace_spec
from pagesim.workload.traces import is_trace_path, read_trace

__all__ = [
    "RequestPlan",
    "Workload",
    "WorkloadSpec",
    "WORKLOAD_PARAMS",
    "load_workload",
    "shipped_workloads",
]

SPEC_SUFFIXES = (".yaml", ".yml")
# vLLM bench names (`--random-input-len` ...) and the trace replay time scale.
WORKLOAD_PARAMS: tuple[str, ...] = (
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "random_prefix_len",
    "time_scale",
)


# `vllm bench serve --dataset-name` values that name a shipped workload by another name.
VLLM_DATASETS: dict[str, str] = {"sharegpt": "chat"}


def shipped_workloads() -> list[str]:
    """Names of the shipped workload specs, sorted."""
    return sorted(p.stem for p in workloads_dir().glob("*.yaml"))


def load_workload(name_or_path: str, **params: Any) -> Workload:
    """Load a shipped workload by name, a YAML spec file, or a trace file.

    params (None means not given): random_input_len, random_output_len, random_range_ratio,
    random_prefix_len (vLLM's defaults 1024, 128, 0.0, 0; only for a workload with random
    lengths, such as `random`) and time_scale (trace replay: arrival = timestamp * scale).
    Raises `UnknownNameError` for an unknown name and `WorkloadError` for anything malformed.
    """
    if not isinstance(name_or_path, str | Path) or not str(name_or_path).strip():
        raise WorkloadError(f"workload = {name_or_path!r}: expected a name or a file path")
    spec = _Loader().load(str(name_or_path), Path.cwd())
    return Workload(_with_params(spec, params))


class _Loader:
    """Resolves names and paths (recursively, for mixes), refusing cycles."""

    def __init__(self) -> None:
        self._stack: list[Path] = []

    def load(self, ref: str, base_dir: Path) -> WorkloadSpec:
        path = self._locate(ref, base_dir)
        if is_trace_path(path):
            return trace_spec(read_trace(path), _stem(path))
        if path in self._stack:
            chain = " -> ".join(p.stem for p in [*self._stack, path])
            raise WorkloadError(f"workload {ref!r}: mix refers to itself ({chain})")
        self._stack.append(path)
        try:
            return parse_spec(
                _read_yaml(path), name=path.stem, base_dir=path.parent, resolve=self.load
            )
        except WorkloadError as e:
            msg = str(e)
            if msg.startswith(("workload", "trace")):  # already names its file
                raise
            raise WorkloadError(f"workload spec {str(path)!r}: {msg}") from None
        finally:
            self._stack.pop()

    @staticmethod
    def _locate(ref: str, base_dir: Path) -> Path:
        looks_like_path = (
            "/" in ref or "\\" in ref or ref.lower().endswith(SPEC_SUFFIXES) or is_trace_path(ref)
        )
        if looks_like_path:
            p = Path(ref).expanduser()
            p = p if p.is_absolute() else base_dir / p
            if not p.is_file():
                raise WorkloadError(f"workload file {str(p)!r} not found")
            if not (is_trace_path(p) or p.name.lower().endswith(SPEC_SUFFIXES)):
                raise WorkloadError(f"workload file {str(p)!r}: expected .yaml, .csv or .jsonl")
            return p.resolve()
        shipped = workloads_dir() / f"{VLLM_DATASETS.get(ref, ref)}.yaml"
        if not shipped.is_file():
            raise unknown_name("workload", ref, shipped_workloads())
        return shipped.resolve()


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".csv", ".jsonl"):
        name = name.removesuffix(suffix)
    return name


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"workload spec {str(path)!r}: cannot read ({e})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise WorkloadError(
            f"workload spec {str(path)!r}: malformed YAML{where}: {problem}"
        ) from None
    if doc is None:  # nothing, or comments only
        raise WorkloadError(f"workload spec {str(path)!r}: the file is empty")
    return doc


def _with_params(spec: WorkloadSpec, params: dict[str, Any]) -> WorkloadSpec:
    given = {k.replace("-", "_"): v for k, v in params.items() if v is not None}
    for key in given:
        if key not in WORKLOAD_PARAMS:
            raise WorkloadError(
                f"unknown workload parameter {key!r} (known: {', '.join(WORKLOAD_PARAMS)})"
            )
    random_args = {
        k.removeprefix("random_"): v for k, v in given.items() if k.startswith("random_")
    }
    if random_args:
        if not isinstance(spec.lengths, RandomLengths):
            key = "random_" + next(iter(random_args))
            raise WorkloadError(
                f"{key} = {given[key]!r}: workload {spec.name!r} has no random "
                f"lengths (use --workload random)"
            )
        spec = replace(spec, lengths=replace(spec.lengths, **random_args))
    if "time_scale" in given:
        if spec.arrival.process != "trace":
            raise WorkloadError(
                f"time_scale = {given['time_scale']!r}: workload {spec.name!r} "
                f"does not replay trace timestamps"
            )
        scale = given["time_scale"]
        if isinstance(scale, bool) or not isinstance(scale, int | float):
            raise WorkloadError(f"time_scale = {scale!r}: must be a number > 0")
        spec = replace(spec, arrival=replace(spec.arrival, time_scale=float(scale)))
    return spec
