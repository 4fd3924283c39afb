"""`pagesim sweep`: a Cartesian grid of simulations, laid out as `vllm bench sweep serve`.

Every engine and load flag of `pagesim run` takes a comma list here (`--block-size 8,16,32
--request-rate 2,4,8`; the switch `--disable-hybrid-kv-cache-manager` sets every point, a list
in the file sweeps it), and `--config FILE.yaml` takes lists as well as single values;
`--engine-params` / `--load-params` (alias `--serve-params` /
`--bench-params`) take JSON or YAML lists of dicts. Exit codes: 0 all runs done, 1 some runs
failed (each reported with its settings), 2 a bad grid or flag.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from pagesim.cli import options as o
from pagesim.cli.app import app
from pagesim.errors import ConfigError
from pagesim.metrics.report import rejection_line
from pagesim.planning.backends import BACKENDS, require_ray
from pagesim.planning.grid import build_grid, coerce, parse_axis, read_param_file
from pagesim.planning.sweep import SweepInterrupted, run_sweep
from pagesim.utils import check_number, check_output_dir, make_output_dir

SWEEP = "Sweep"
sweep_option = partial(o.panel_option, SWEEP)
MAX_RUNS = 1_000_000  # simulations of one sweep (points x runs)


def _axes(option: Callable[..., Any], hints: dict[str, Any]) -> dict[str, Any]:
    """Settings that take a comma list here (one axis of the grid each): a hint (help text)
    makes a list option; an annotation is an option that stands as it is."""
    return {
        name: (Annotated[str | None, option(hint)] if isinstance(hint, str) else hint)
        for name, hint in hints.items()
    }


Workload = Annotated[
    str | None,
    o.load_option("Names, files or mixes (chat:0.7+code:0.3)", "--workload", "--dataset-name"),
]
# Every engine and load setting of `pagesim run`, as a sweep takes it; the switch and the
# run-wide settings keep `run`'s options.
ENGINE_AXES = _axes(
    o.engine_option,
    {
        "model": "Comma list of model names",
        "gpu": "Comma list of GPU names",
        "block_size": "e.g. 8,16,32",
        "gpu_memory_utilization": "e.g. 0.8,0.92",
        "num_gpu_blocks_override": "",
        "kv_cache_memory_bytes": "KV cache bytes (vLLM's flag)",
        "max_num_seqs": "",
        "max_num_batched_tokens": "",
        "max_model_len": "",
        "enable_prefix_caching": "true,false",
        "enable_chunked_prefill": "true,false",
        "long_prefill_token_threshold": "",
        "preemption_mode": "recompute,swap",
        "swap_space": "GiB",
        "scheduling_policy": "fcfs,priority",
        "allocator": "paged,reserve-max,pow2,oracle",
        "contiguous_placement": "buddy,first-fit",
        "disable_hybrid_kv_cache_manager": o.DisableHybridKVCacheManager,
        "kv_cache_dtype": "auto,fp8",
        "tensor_parallel_size": "",
        "vllm_compat": "0.33,0.23",
        "profile": "Calibration directories, or analytical",
    },
)
LOAD_AXES = _axes(
    o.load_option,
    {
        "workload": Workload,
        "num_prompts": "",
        "request_rate": "req/s, inf = all at once",
        "burstiness": "",
        "max_concurrency": "",
        "seed": "Base seed(s); run N uses seed + N",
        "random_input_len": "",
        "random_output_len": "",
        "random_range_ratio": "",
        "random_prefix_len": "",
        "time_scale": "",
        "goodput": o.Goodput,
        "metric_percentiles": o.MetricPercentiles,
    },
)


@app.command("sweep")
@o.with_options(ENGINE_AXES, LOAD_AXES)
def sweep_command(
    config: o.ConfigFile = None,
    engine_params: Annotated[
        Path | None,
        sweep_option("JSON/YAML list of engine setting dicts", "--engine-params", "--serve-params"),
    ] = None,
    load_params: Annotated[
        Path | None,
        sweep_option("JSON/YAML list of load setting dicts", "--load-params", "--bench-params"),
    ] = None,
    num_runs: Annotated[int, sweep_option("Runs (seeds) per point")] = 1,
    output_dir: Annotated[Path, sweep_option(None, "--output-dir", "-o")] = Path("results"),
    resume: Annotated[
        str | None,
        sweep_option("Timestamp (under --output-dir) or directory of a sweep to complete"),
    ] = None,
    dry_run: Annotated[bool, sweep_option("List the points; run nothing")] = False,
    backend: Annotated[str, sweep_option("local | ray")] = "local",
    address: Annotated[str | None, sweep_option("Ray cluster to join (ray backend)")] = None,
    jobs: Annotated[int | None, sweep_option("Parallel runs [all cores]")] = None,
    save_records: Annotated[bool, sweep_option("Per-request and per-step Parquet per run")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar")] = False,
    **flags: Any,
) -> None:
    """Simulate every combination of the given settings; write run JSONs and summary.csv."""
    goodput = flags.pop("goodput")
    metric_percentiles = flags.pop("metric_percentiles")
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if jobs is not None:
        check_number("--jobs", jobs, integer=True, low=1, high=4096)
    check_number("--num-runs", num_runs, integer=True, low=1, high=MAX_RUNS)
    check_output_dir(output_dir, "--output-dir")
    file_values, file_axes = _read_config(config)
    percentiles = o.parse_percentiles(
        metric_percentiles or file_values.pop("metric_percentiles", None)
    )
    slos = o.parse_goodput(goodput or file_values.pop("goodput", None))
    if flags["profile"]:
        file_values.pop("profile", None)
    axes = {k: parse_axis(k, v) for k, v in flags.items() if v is not None}
    for key, values in file_axes.items():  # flags win over the file
        axes.setdefault(key, values)
    grid = build_grid(
        axes,
        base={"workload": "chat", "num_prompts": 1000, **file_values},
        engine_params=read_param_file(engine_params, "engine") if engine_params else None,
        load_params=read_param_file(load_params, "load") if load_params else None,
    )
    if len(grid) * num_runs > MAX_RUNS:
        raise ConfigError(
            f"sweep: {len(grid):,} points x {num_runs:,} runs; at most {MAX_RUNS:,} runs: "
            "split the sweep"
        )
    if dry_run:
        _print_plan(grid, num_runs)
        return
    if backend == "ray":
        require_ray()
    if resume is None:  # a check cannot see every folder that mkdir refuses
        make_output_dir(output_dir, "--output-dir")
    try:
        with _sigterm_as_interrupt():
            result = run_sweep(
                grid,
                num_runs=num_runs,
                output_dir=output_dir,
                resume=resume,
                backend=backend,
                n_jobs=jobs,
                address=address,
                save_records=save_records,
                percentiles=percentiles,
                goodput_slos_ms=slos,
                progress=not quiet and sys.stderr.isatty(),
            )
    except SweepInterrupted as exc:
        print(f"{exc}; resume with:\n  {_resume_command(exc.directory)}", file=sys.stderr)
        raise typer.Exit(130) from None
    ran = len(result.summary) - result.num_skipped
    rejecting = _rejections(result.summary)
    print(
        f"{len(grid)} points x {num_runs} runs: {ran} run, {result.num_skipped} already done, "
        f"{len(result.failures)} failed, {len(rejecting)} with rejected requests"
    )
    print(f"Results in {result.directory} (summary.csv, summary.parquet)")
    for line in rejecting:
        print(line, file=sys.stderr)
    for f in result.failures:
        settings = ", ".join(f"{k}={v}" for k, v in f["settings"].items())
        print(f"failed: {f['point']} run={f['run']} ({settings}): {f['error']}", file=sys.stderr)
    if result.failures:
        raise typer.Exit(1)


def _rejections(summary) -> list[str]:
    """One line per run that rejected requests: its point, and how many and why."""
    if "num_rejected" not in summary:
        return []
    lines = []
    for row in summary[summary["num_rejected"].fillna(0) > 0].to_dict("records"):
        reasons = row.get("rejected_reasons")
        line = rejection_line(
            {
                **row,  # num_rejected, completed, failed
                "rejected_reasons": json.loads(reasons) if isinstance(reasons, str) else {},
                "engine_config": {"max_model_len": row.get("max_model_len")},
            }
        )
        lines.append(f"rejected: {row['point']} run={row['run']}: {line}")
    return lines


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a sweep as Ctrl-C does: its workers stop, its written runs stay."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _resume_command(directory: Path) -> str:
    """The command line that resumes this sweep: its own arguments (from the console script)
    with --resume DIRECTORY in place of any --resume given."""
    argv = sys.argv[1:]
    if argv[:1] != ["sweep"]:  # called in process, not from the console script
        return f"pagesim sweep <the same arguments> --resume {directory}"
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume="):
            args.append(a)
    return shlex.join(["pagesim", *args, "--resume", str(directory)])


def _print_plan(grid, num_runs: int) -> None:
    print(f"{len(grid)} points x {num_runs} runs = {len(grid) * num_runs} simulations")
    if grid.varying:
        print(f"varying: {', '.join(grid.varying)}")
    for p in grid.points:
        settings = ", ".join(f"{k}={v}" for k, v in p.settings.items())
        print(f"  [{p.index}] {p.name}: {settings}")


def _read_config(path: Path | None) -> tuple[dict, dict]:
    """`--config` for a sweep: single values (as `pagesim run` reads them) and lists (axes)."""
    if path is None:
        return {}, {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError:
        raise ConfigError(f"--config {path}: no such file") from None
    except yaml.YAMLError:
        raise ConfigError(f"--config {path}: malformed YAML") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of settings")
    values, axes = {}, {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in ("goodput", "metric_percentiles"):
            values[key] = v
        elif isinstance(v, list):
            if not v:
                raise ConfigError(f"--config {path}: {key}: empty list")
            axes[key] = [_coerce_file(path, key, item) for item in v]
        else:
            values[key] = _coerce_file(path, key, v)
    return values, axes


def _coerce_file(path: Path, key: str, value):
    try:
        return coerce(key, value)
    except ConfigError as exc:
        raise ConfigError(f"--config {path}: {str(exc).removeprefix('sweep: ')}") from None
