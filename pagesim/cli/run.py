"""`pagesim run`: one simulation, reported exactly as `vllm bench serve` reports a benchmark."""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from pagesim.cli import options as o
from pagesim.cli.app import app
from pagesim.cli.traffic import default_num_prompts, rate_label, trace_note, traffic_of
from pagesim.errors import ConfigError
from pagesim.metrics import format_benchmark_block
from pagesim.metrics.report import rejection_hint, rejection_line
from pagesim.planning.mix import workload_ref
from pagesim.sim.band import format_band, metric_band
from pagesim.sim.build import (
    band_cost_model,
    block_size_note,
    cost_model_label,
    cost_model_line,
    default_profile,
    pricing_profile,
    profile_record,
    scaled_cost_model,
    step_time_band,
)
from pagesim.sim.output import default_result_filename, format_kv_block, result_json, write_parquet
from pagesim.sim.simulate import result_metadata, simulate
from pagesim.utils import atomic_write_bytes, check_output_file, make_output_dir, write_new_file
from pagesim.workload import VLLM_DATASETS

DEFAULTS = {"workload": "chat", "num_prompts": 1000}


@app.command("run")
@o.with_options(o.engine_options, o.pricing_options, o.load_options)
def run_command(
    config: o.ConfigFile = None,
    save_result: Annotated[bool, typer.Option(help="Write the result JSON.")] = False,
    result_dir: Annotated[
        Path | None,
        typer.Option(help="Where results go; also writes per-request and per-step Parquet."),
    ] = None,
    result_filename: Annotated[str | None, typer.Option()] = None,
    overwrite: Annotated[
        bool, typer.Option(help="Replace an existing --result-filename (refused otherwise).")
    ] = False,
    check_invariants: Annotated[
        bool, typer.Option(help="Check KV allocator invariants after every operation (slow).")
    ] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    band: Annotated[
        bool,
        typer.Option(
            help="Also simulate at the ends of the profile's measured spread of GPU speed "
            "(two more runs) and print the headline metrics' range."
        ),
    ] = True,
    **flags: Any,
) -> None:
    """Simulate one engine serving a workload; print vllm bench's result block and KV usage."""
    step_time_scale = flags.pop("step_time_scale")
    off = tuple(flags.pop("disable_correction") or ())
    shown = o.parse_percentile_metrics(flags.pop("percentile_metrics"))
    file_values = o.read_config_file(config)
    values = o.merge({**DEFAULTS, **file_values}, flags)
    with workload_ref(str(values["workload"])) as ref:
        traffic = traffic_of({**values, "workload": ref})
        defaulted = flags["num_prompts"] is None and "num_prompts" not in file_values
        if defaulted:
            values["num_prompts"] = default_num_prompts(traffic, DEFAULTS["num_prompts"])
        engine = o.engine_config(values)
        load = o.load_spec(values)
        prof = values.get("profile") or default_profile(engine)
        cost = scaled_cost_model(engine, prof, step_time_scale, True, off)
        for note in (
            block_size_note(prof, engine.block_size) if prof is not None else None,
            trace_note(traffic, load.num_prompts, defaulted),
        ):
            if note:
                typer.echo(note, err=True)
        directory = result_dir or Path(".")
        if save_result or result_dir is not None:
            # before simulating: a bad --result-dir fails at once
            make_output_dir(directory, "--result-dir")
            if result_filename is not None:
                _check_result_filename(directory, result_filename, overwrite)
        with _progress(load.num_prompts, quiet) as hook:
            sim = simulate(
                engine,
                dataclasses.replace(load, workload=ref),
                profile=prof,
                check_invariants=check_invariants,
                progress=hook,
                cost_model=cost,
            )
        ends = step_time_band(engine, prof, transfer=True) if band else None
        band_doc = None
        if ends is not None:
            served = dataclasses.replace(load, workload=ref)

            def simulate_at(factor: float) -> dict:
                priced = band_cost_model(engine, prof, factor, True, off)
                return simulate(engine, served, profile=prof, cost_model=priced).result

            band_doc = metric_band(sim.result, simulate_at, ends.scaled(step_time_scale))
    rate = load.request_rate if load.request_rate is not None else math.inf
    tp = f" x {engine.tensor_parallel_size}" if engine.tensor_parallel_size > 1 else ""
    print(
        f"Simulated {engine.model} on {engine.gpu}{tp}, block size {engine.block_size}: "
        f"workload {VLLM_DATASETS.get(values['workload'], values['workload'])}, "
        f"{load.num_prompts} prompts"
    )
    print(
        format_benchmark_block(
            sim.result,
            request_rate=rate,
            max_concurrency=load.max_concurrency,
            percentiles=load.percentiles,
            metrics=shown,
        )
    )
    print(format_kv_block(sim.result))
    if band_doc is not None:  # before the cost-model line, which stays the last line
        print(format_band(sim.result, band_doc, shown))
    print(cost_model_line(engine, prof, step_time_scale=step_time_scale, disabled_corrections=off))
    rejected = rejection_line(sim.result)
    if rejected:
        typer.echo(rejected, err=True)
        hint = rejection_hint(sim.result)
        if hint:
            typer.echo(hint, err=True)
    if save_result or result_dir is not None:
        metadata = result_metadata(engine, load)
        metadata["cost_model"] = cost_model_label(engine, prof, transfer=True)
        metadata["profile"] = profile_record(pricing_profile(engine, prof, transfer=True))
        if cost is not None:
            metadata["step_time_scale"] = step_time_scale
        if off:
            metadata["disabled_corrections"] = list(off)
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        saved = sim.result if band_doc is None else {**sim.result, "band": band_doc}
        text = result_json(saved, metadata, date=date).encode("utf-8")
        default = default_result_filename(metadata, date, arrival=rate_label(traffic))
        try:
            path = _save(directory, result_filename, default, text, overwrite)
            name = path.name
            print(f"Saved result to {path}")
            if result_dir is not None:
                for p in write_parquet(sim.metrics, directory, Path(name).stem):
                    print(f"Saved records to {p}")
        except OSError as exc:
            raise ConfigError(f"cannot write {exc.filename or directory}: {exc.strerror}") from None


def _check_result_filename(directory: Path, name: str, overwrite: bool) -> None:
    """A --result-filename is joined to --result-dir (an absolute one stands alone, as in
    `vllm bench serve`), and must not be taken unless --overwrite. Its folder is created
    here, as --result-dir's is: a missing one must not cost the run."""
    if Path(name).name in ("", ".", ".."):
        raise ConfigError(f"--result-filename {name!r}: a file name was expected")
    check_output_file(directory / name, "--result-filename")
    if (directory / name).exists() and not overwrite:
        raise ConfigError(
            f"--result-filename {name}: {directory / name} exists; give --overwrite to replace it"
        )
    make_output_dir((directory / name).parent, "--result-filename", shown=name)


def _save(directory: Path, given: str | None, default: str, text: bytes, overwrite: bool) -> Path:
    """Write the result JSON without replacing another run's: a given name is replaced only
    with --overwrite (checked before the run); a default name that is taken (runs started in
    the same second) gets a -2, -3, ... suffix."""
    if given is not None:
        path = directory / given
        if overwrite:
            atomic_write_bytes(path, text)
            return path
        if write_new_file(path, text):
            return path
        raise ConfigError(f"--result-filename {given}: {path} exists; give --overwrite")
    stem, suffix = default[: -len(".json")], ".json"
    for n in range(1, 10_000):
        path = directory / (default if n == 1 else f"{stem}-{n}{suffix}")
        if write_new_file(path, text):
            return path
    raise ConfigError(f"--result-dir {directory}: 10,000 results named {default} already")


class _progress:
    """A rich progress bar that appears only when the run lasts more than a second."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.bar = None
        self.task = None
        self.start = time.monotonic()
        self.last = 0

    def __enter__(self):
        return None if self.quiet else self.hook

    def hook(self, done: int, total: int) -> None:
        if done - self.last < 64 and done != total:
            return
        self.last = done
        if self.bar is None:
            # The bar is for a person at a terminal: on stderr, never in piped output.
            if time.monotonic() - self.start < 1.0 or not sys.stderr.isatty():
                return
            from rich.console import Console
            from rich.progress import Progress

            self.bar = Progress(transient=True, console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("simulating", total=total)
        self.bar.update(self.task, completed=done)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
