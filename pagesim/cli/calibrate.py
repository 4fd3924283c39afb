"""`pagesim calibrate`: measure step times on the local GPU and write a calibration profile.

GPU code is imported inside the command only: without CUDA (or torch/triton) the command
exits 2 with one line, and `import pagesim.cli` never needs torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pagesim.cli import options as o
from pagesim.cli.app import app, gpu_engine_config
from pagesim.errors import ConfigError
from pagesim.utils import check_number, check_output_dir, make_output_dir, parse_int_list

#: `CalibrationGrid.decode_batches`' default, repeated here: the CLI imports `pagesim.gpu` only
#: inside the commands that need it (a test holds the two equal).
DEFAULT_DECODE_BATCHES = (1, 4, 8, 16, 24, 32, 48, 64, 128, 192, 256, 384, 512)


# The engine options a calibration sizes its KV cache and batches with (after --dtype).
ENGINE_FLAGS = ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len")


@app.command("calibrate")
@o.with_options(o.pick(o.engine_options, *ENGINE_FLAGS), after="dtype")
def calibrate_command(
    model: o.Model = None,
    block_sizes: Annotated[
        str, typer.Option(help="Block sizes to measure, comma separated.")
    ] = "8,16,32,64,128",
    full_block_sizes: Annotated[
        str,
        typer.Option(
            help="Block sizes that also get prefill and mixed rows (the others: decode only)."
        ),
    ] = "8,16,32,64,128",
    decode_batches: Annotated[
        str,
        typer.Option(
            help="Decode batch sizes to time, comma separated. The default holds every CUDA-graph "
            "size up to 64 but 2: between two timed sizes the decode kernel's split can "
            "change, and the interpolation cannot see it."
        ),
    ] = ",".join(map(str, DEFAULT_DECODE_BATCHES)),
    dtype: Annotated[str, typer.Option(help="bfloat16 | float16")] = "bfloat16",
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    output_dir: Annotated[
        Path, typer.Option(help="Calibration root; the profile goes to <root>/<gpu>/<model>/.")
    ] = Path("calibration"),
    time_budget_s: Annotated[
        float, typer.Option(help="Stop measuring new grid points after this many seconds.")
    ] = 480.0,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    enforce_eager: Annotated[
        bool,
        typer.Option(
            "--enforce-eager", help="No CUDA graphs: decode steps launch eagerly too (vLLM's flag)."
        ),
    ] = False,
    tensor_parallel_size: o.TP = None,
    shard_only: Annotated[
        bool,
        typer.Option(
            "--shard-only",
            help="With --tensor-parallel-size N: time rank 0's shard alone on this "
            "one GPU (no communication; the cost model adds the all-reduces).",
        ),
    ] = False,
    **flags: Any,
) -> None:
    """Sweep decode, prefill and mixed step shapes per block size on this GPU (random weights),
    measure KV capacity and host overhead, and write a versioned profile. With
    --tensor-parallel-size N: one process per GPU, steps through rank 0's broadcast, plus the
    all-reduce table (profile <root>/<gpu>/<model>-tp<N>/), CUDA graphs on every rank with
    their NCCL all-reduces inside unless --enforce-eager."""
    from pagesim.data import calibration_dir
    from pagesim.gpu.device import require_cuda, torch_dtype

    # bad input first, GPU or not
    batches = parse_int_list(decode_batches, "decode-batches")
    sizes = parse_int_list(block_sizes, "block-sizes")
    full_sizes = parse_int_list(full_block_sizes, "full-block-sizes")
    check_number("--time-budget-s", time_budget_s, low=0, low_open=True)
    check_output_dir(output_dir, "--output-dir")
    shipped = Path(str(calibration_dir())).resolve()
    if output_dir.resolve() == shipped or shipped in output_dir.resolve().parents:
        raise ConfigError(
            f"--output-dir {output_dir}: is inside the shipped profiles ({shipped}); write "
            "elsewhere and pass the profile with --profile"
        )
    config = gpu_engine_config(model, tensor_parallel_size=tensor_parallel_size, **flags)
    make_output_dir(output_dir, "--output-dir")  # not after minutes of measuring
    require_cuda()
    from pagesim.gpu.calibrate import CalibrationGrid
    from pagesim.gpu.profiler import run_calibration

    grid = CalibrationGrid(
        block_sizes=sizes, full_block_sizes=full_sizes, decode_batches=tuple(sorted(set(batches)))
    )
    cuda_graphs = not enforce_eager
    if config.tensor_parallel_size > 1 or shard_only:
        _check_tp(config)
        if not shard_only:
            _launch_tp(
                config, grid, torch_dtype(dtype), seed, output_dir, time_budget_s, cuda_graphs
            )
            return
    with _bar(quiet) as progress:
        result = run_calibration(
            config,
            grid,
            dtype=torch_dtype(dtype),
            seed=seed,
            calibration_root=output_dir,
            progress=progress,
            time_budget_s=time_budget_s,
            log=typer.echo,
            cuda_graphs=cuda_graphs,
        )
    p = result.profile
    typer.echo(
        f"profile: {result.directory} ({len(p.decode)} decode, {len(p.prefill)} prefill, "
        f"{len(p.mixed)} mixed, {len(p.overhead)} overhead rows) in "
        f"{result.elapsed_s:.0f} s"
    )
    if shard_only:  # one rank's shard: no whole-model profile to fit
        return
    from pagesim.cost.fit import fit_report

    typer.echo("held-out fit error, % (20 % of each table, seed 0; `pagesim fit-report`):")
    typer.echo(fit_report(p).to_markdown())


def _check_tp(config) -> None:
    """`--tensor-parallel-size N` or `--shard-only`: N >= 2 that the model's heads divide."""
    from pagesim.gpu.tp_model import check_tensor_parallel

    tp = config.tensor_parallel_size
    if tp < 2:
        raise ConfigError("--shard-only: give --tensor-parallel-size N with N >= 2")
    check_tensor_parallel(config.model_spec, tp)


def _launch_tp(
    config, grid, dtype, seed: int, output_dir: Path, time_budget_s: float, cuda_graphs: bool
) -> None:
    """`--tensor-parallel-size N` without `--shard-only`: N processes, one per GPU."""
    import torch

    tp = config.tensor_parallel_size
    if torch.cuda.device_count() < tp:
        raise ConfigError(
            f"--tensor-parallel-size {tp}: needs {tp} GPUs, this machine has "
            f"{torch.cuda.device_count()} (--shard-only times one rank's shard "
            "on one GPU)"
        )
    from pagesim.gpu.parallel import launch
    from pagesim.gpu.tp_profiler import calibration_main

    launch(
        calibration_main,
        tp,
        config,
        grid,
        dtype,
        seed,
        str(output_dir),
        time_budget_s,
        "cuda",
        cuda_graphs,
    )


class _bar:
    """A rich progress bar fed by the calibrator's (done, total, label) callback."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress = None
        self.task = None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
        )
        self.progress.start()
        self.task = self.progress.add_task("calibrating", total=1)

        def update(done: int, total: int, label: str) -> None:
            self.progress.update(self.task, completed=done, total=total, description=label)

        return update

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
