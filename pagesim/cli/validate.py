"""`pagesim validate`: simulator prediction vs a real GPU run of the same requests.

Two ways in:

    pagesim validate --real run.json [--real ...]     compare stored real runs (any machine)
    pagesim validate --model llama-2-7b --workload chat --request-rate 8 [--repeats 3] ...
                                                      serve on this GPU now, then compare

Writes `<name>.json` (real, predicted, error % per metric), `<name>.md` and `<name>.png`
under `--output-dir`; a fresh real run is also stored under `<output-dir>/real/`. Runs of
identical traffic (`--repeats`, or stored runs of one load and engine) are simulated once and
also compared as one: the prediction against the real runs' mean, beside their spread.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from pagesim.cli import options as o
from pagesim.cli.app import GPU_COMMANDS, app, gpu_engine_config
from pagesim.errors import ConfigError
from pagesim.utils import make_output_dir

# The engine and load settings a GPU run of `validate` serves with.
ENGINE_FLAGS = (
    "model",
    "block_size",
    "gpu_memory_utilization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_prefix_caching",
)
LOAD_FLAGS = ("workload", "num_prompts", "request_rate", "burstiness", "seed")


@app.command("validate")
@o.with_options(
    o.pick(o.engine_options, *ENGINE_FLAGS), o.pick(o.load_options, *LOAD_FLAGS), after="name"
)
def validate_command(
    real: Annotated[
        list[Path] | None,
        typer.Option(help="Stored real run(s) to compare (no GPU needed); repeatable."),
    ] = None,
    profile: o.ProfileOpt = None,
    output_dir: Annotated[Path, typer.Option(help="Where the report goes.")] = Path(
        "results/validation"
    ),
    name: Annotated[str, typer.Option(help="Report file stem.")] = "validation",
    dtype: Annotated[str, typer.Option(help="bfloat16 | float16 (GPU runs)")] = "bfloat16",
    enforce_eager: Annotated[
        bool, typer.Option("--enforce-eager", help="GPU runs: no CUDA graphs (vLLM's flag).")
    ] = False,
    repeats: Annotated[
        int,
        typer.Option(min=1, help="GPU runs: serve the load this many times, one after another."),
    ] = 1,
    **flags: Any,
) -> None:
    """Run (or read) a real GPU run, simulate the same requests priced as `pagesim run` prices
    them (the profile of that GPU, else by transfer of the H200's), and report per metric the
    real value, the prediction and the error in %."""
    from pagesim.validate.compare import TruncatedRunError, validate_real_run
    from pagesim.validate.report import write_report

    make_output_dir(output_dir, "--output-dir")  # before simulating or serving, as run does
    predictions: dict = {}  # one simulation per traffic: repeats are priced once
    if real:
        entries, skipped = [], []
        for p in real:
            try:
                entries.append(validate_real_run(p, profile or _default_profile(p), predictions))
            except TruncatedRunError as e:  # the other runs are still worth a report
                skipped.append(str(e))
        if not entries:
            raise ConfigError(
                skipped[0]
                if len(skipped) == 1
                else f"no real run to compare: all {len(skipped)} were cut at their "
                "wall-clock limit"
            )
        for note in skipped:
            typer.echo(f"skipped: {note}", err=True)
    else:
        skipped = []
        engine = {k: flags[k] for k in ENGINE_FLAGS}
        load = tuple(flags[k] for k in LOAD_FLAGS)
        paths = _serve_now(engine, load, dtype, output_dir, enforce_eager, repeats)
        entries = [validate_real_run(p, profile or _default_profile(p), predictions) for p in paths]
    for e in entries:
        if "runner_note" in e:
            typer.echo(f"warning: {e['run']}: {e['runner_note']}", err=True)
    paths = write_report(entries, output_dir, name, tuple(skipped))
    from pagesim.validate.report import report_tables

    typer.echo(report_tables(entries), nl=False)
    typer.echo(f"report: {paths['json']}, {paths['md']}, {paths['png']}")


def _default_profile(real_path: Path) -> Path | None:
    from pagesim.config import EngineConfig
    from pagesim.sim.build import default_profile
    from pagesim.validate.store import read_real_run

    cfg = read_real_run(real_path)["engine_config"]
    return default_profile(EngineConfig(**cfg))


def _serve_now(
    engine: dict[str, Any],
    load_flags: tuple,
    dtype: str,
    output_dir: Path,
    enforce_eager: bool,
    repeats: int,
) -> list[Path]:
    """Measure the KV cache of the engine that `engine` (`gpu_engine_config`'s flags) gives,
    serve the load of `load_flags` (workload, num_prompts, request_rate, burstiness, seed) on
    this GPU `repeats` times, store each real run (the second as `<stem>-r2`, ...); returns
    their paths."""
    from pagesim.sim.simulate import LoadSpec

    workload, num_prompts, request_rate, burstiness, seed = load_flags

    # bad input first, GPU or not
    LoadSpec(
        request_rate=request_rate, burstiness=burstiness or 1.0, num_prompts=num_prompts or 200
    )
    from pagesim.gpu.device import require_cuda, torch_dtype

    require_cuda(GPU_COMMANDS["validate"])
    import torch

    from pagesim.gpu.device import device_info
    from pagesim.gpu.memory import MemorySnapshot, measure_kv_capacity
    from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
    from pagesim.validate.serve import serve_workload
    from pagesim.validate.store import load_dict, save_real_run

    config = gpu_engine_config(**engine)
    if request_rate is not None and not (request_rate > 0):
        raise ConfigError(f"--request-rate {request_rate}: must be > 0 (or inf)")
    device = torch.device("cuda")
    before = MemorySnapshot.take(device)
    weights = RandomWeightDecoder(
        DecoderConfig(config.model_spec, torch_dtype(dtype), device, config.block_size, seed or 0)
    )
    capacity = measure_kv_capacity(config, weights, before, (config.block_size,))
    typer.echo(capacity.report())
    load = load_dict(
        workload or "chat",
        num_prompts or 200,
        seed or 0,
        math.inf if request_rate is None else request_rate,
        burstiness or 1.0,
    )
    stem = f"{config.model}-{load['workload']}-{load['request_rate']}-bs{config.block_size}"
    paths = []
    for k in range(1, repeats + 1):
        result, records = serve_workload(
            config,
            weights,
            capacity.num_gpu_blocks[config.block_size],
            load,
            cuda_graphs=not enforce_eager,
            log=typer.echo,
        )
        path = output_dir / "real" / (f"{stem}.json.xz" if k == 1 else f"{stem}-r{k}.json.xz")
        paths.append(
            save_real_run(
                path,
                config=config,
                load=load,
                result=result,
                records=records,
                device=device_info(device),
                extra={"capacity": capacity.to_dict()},
            )
        )
    return paths
