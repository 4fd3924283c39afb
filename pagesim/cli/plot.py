"""`pagesim plot`: figures from a sweep directory (PNG and SVG, under DIR/plots by default).

A figure that would show zeros only (no preemption, no prefix hit anywhere) is not drawn: one
line says why instead.

    pagesim plot results/20260101_120000                    every figure the grid supports
    pagesim plot DIR --kind latency --curve-by block_size   one kind, curves by a setting

Kinds: latency (needs request_rate to vary), block-size (block_size), prefix (cache size:
num_gpu_blocks_override or kv_cache_memory_bytes), preemption (request_rate), waste
(allocator), timeline (runs saved with --save-records), pareto (any grid).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from pagesim.cli.app import app
from pagesim.errors import ConfigError
from pagesim.planning import plots
from pagesim.planning.summary import read_summary
from pagesim.planning.waste import waste_timeline_from_steps
from pagesim.utils import make_output_dir

KINDS = ("latency", "block-size", "prefix", "preemption", "waste", "timeline", "pareto")
X_OF = {
    "latency": "request_rate",
    "block-size": "block_size",
    "preemption": "request_rate",
    "waste": "allocator",
}


def _check_formats(fmts: list[str]) -> None:
    import matplotlib.pyplot as plt

    known = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    for f in fmts or [""]:
        if f not in known:
            raise ConfigError(f"--format {f!r}: choose from {', '.join(sorted(known))}")


@app.command("plot")
def plot_command(
    directory: Annotated[Path, typer.Argument(help="A sweep directory (holds summary.csv)")],
    kind: Annotated[
        list[str] | None, typer.Option(help=" | ".join(KINDS) + " [all that apply]")
    ] = None,
    curve_by: Annotated[
        str | None, typer.Option(help="Summary column that separates curves")
    ] = None,
    output_dir: Annotated[Path | None, typer.Option(help="[DIRECTORY/plots]")] = None,
    formats: Annotated[str, typer.Option("--format", help="Comma list")] = "png,svg",
) -> None:
    """Plot a sweep's results."""
    df = read_summary(directory)
    varying = _varying(directory, df)
    for k in kind or []:
        if k not in KINDS:
            raise ConfigError(f"--kind {k!r}: choose from {', '.join(KINDS)}")
    if curve_by is not None and curve_by not in df:
        raise ConfigError(f"--curve-by {curve_by!r}: not a column of the summary")
    wanted = kind or [k for k in KINDS if _applies(k, varying, directory)]
    out = output_dir or Path(directory) / "plots"
    fmts = [f.strip() for f in formats.split(",") if f.strip()]
    _check_formats(fmts)
    make_output_dir(out, "--output-dir")  # before any figure: mkdir refuses what checks pass
    for k in wanted:
        empty = _all_zero(k, df)
        if empty:
            print(f"No {k}.png: {empty}")
            continue
        try:
            fig = _figure(k, df, directory, varying, curve_by)
        except KeyError as exc:
            raise ConfigError(
                f"{directory}: the summary has no column {exc} that --kind {k} plots"
            ) from None
        for path in plots.save_figure(fig, out, k, fmts):
            print(f"Saved {path}")


# What a kind of figure would show, and what it means when that is zero in every run.
ZERO_MEANS = {
    "preemption": ("num_preemptions", "no run preempted a request (the KV cache never ran out)"),
    "prefix": ("prefix_cache_hit_rate", "no run had a prefix cache hit"),
}


def _all_zero(kind: str, df: pd.DataFrame) -> str | None:
    """Why `kind` would be a figure of zeros only, or None when it shows something."""
    col, why = ZERO_MEANS.get(kind, (None, ""))
    ok = df[df["status"] == "ok"] if "status" in df else df
    if col is None or col not in ok or ok[col].fillna(0).abs().sum() > 0:
        return None
    return f"{why}; {col} is 0 everywhere"


def _varying(directory: Path, df: pd.DataFrame) -> list[str]:
    manifest = Path(directory) / "sweep.json"
    if manifest.is_file():
        return list(json.loads(manifest.read_text()).get("varying", []))
    return [c for c in df.columns if df[c].nunique(dropna=False) > 1]


def _cache_x(varying: list[str]) -> str | None:
    return next((c for c in plots.CACHE_AXES if c in varying), None)


def _applies(kind: str, varying: list[str], directory: Path) -> bool:
    if kind == "pareto":
        return True
    if kind == "prefix":
        return _cache_x(varying) is not None
    if kind == "timeline":
        return any(Path(directory).glob("*/run=0.steps.parquet"))
    return X_OF[kind] in varying


def _pick_curve(varying: list[str], x: str, given: str | None) -> str | None:
    if given is not None:
        return given
    return next((c for c in varying if c not in (x, "seed")), None)


def _figure(kind: str, df: pd.DataFrame, directory: Path, varying: list[str], curve_by: str | None):
    by_x = {
        "latency": plots.plot_latency_vs_rate,
        "block-size": plots.plot_block_size_curves,
        "preemption": plots.plot_preemption_vs_load,
    }
    if kind in by_x:
        return by_x[kind](df, curve_by=_pick_curve(varying, X_OF[kind], curve_by))
    if kind == "prefix":
        x = _cache_x(varying) or "num_gpu_blocks_override"
        return plots.plot_prefix_hit_vs_cache(df, x=x, curve_by=_pick_curve(varying, x, curve_by))
    if kind == "waste":
        table = df[df["status"] == "ok"].groupby("allocator", sort=False).mean(numeric_only=True)
        return plots.plot_waste_bars(table, plots.describe(df, "KV waste by allocator"))
    if kind == "timeline":
        timelines = {}
        for path in sorted(Path(directory).glob("*/run=0.steps.parquet"))[:8]:
            timelines[path.parent.name] = waste_timeline_from_steps(pd.read_parquet(path))
        return plots.plot_kv_timeline(timelines, plots.describe(df, "KV memory over time"))
    settings = [c for c in varying if c not in ("workload", "seed", curve_by)]
    return plots.plot_pareto(df, label_by=curve_by, label_points=settings)
