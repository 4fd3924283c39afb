"""Figures from sweep summaries and runs (matplotlib, Agg canvas, PNG and SVG).

Every function takes tidy data (a sweep summary: one row per run, see `summary.py`) and
returns a `matplotlib.figure.Figure` drawn on an Agg canvas, so nothing depends on a display
or on pyplot's global state. Runs of one point (seeds) are averaged. Titles name the model,
the GPU and the workload found in the data; axes carry units.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pagesim.errors import ConfigError
from pagesim.planning.waste import WASTE_COLUMNS, WASTE_LABELS

WASTE_COLORS = {
    "kv_token_state_frac": "#4c9a2a",
    "kv_reserved_frac": "#f2c14e",
    "kv_internal_frag_frac": "#f78154",
    "kv_external_frag_frac": "#d1495b",
    "kv_free_frac": "#dddddd",
}


def new_figure(
    nrows: int = 1, ncols: int = 1, *, width: float = 6.4, height: float = 4.2, sharex: bool = False
) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
    return fig, axes.ravel()


def save_figure(
    fig: Figure, directory: Path | str, stem: str, formats: Sequence[str] = ("png", "svg")
) -> list[Path]:
    """Write `<directory>/<stem>.<fmt>` for each format; SVG output is made reproducible."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        meta = {"Date": None} if fmt == "svg" else None
        with matplotlib.rc_context({"svg.hashsalt": "pagesim"}):
            fig.savefig(path, dpi=120, metadata=meta, format=fmt)
        paths.append(path)
    return paths


def describe(df: pd.DataFrame, extra: str = "") -> str:
    """`llama-2-7b on h200, workload chat` from the data's model, gpu and workload columns."""

    def values(col: str) -> str:
        if col not in df:
            return "?"
        vals = sorted({str(v) for v in df[col].dropna()})
        return ", ".join(vals) if len(vals) <= 3 else f"{len(vals)} {col}s"

    text = f"{values('model')} on {values('gpu')}, workload {values('workload')}"
    return f"{extra} ({text})" if extra else text


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df else df


def _curves(df: pd.DataFrame, x: str, ys: Sequence[str], curve_by: str | None):
    """(label, mean-over-runs frame sorted by x) per curve."""
    df = _ok(df)
    missing = [c for c in (x, *ys, *([curve_by] if curve_by else [])) if c not in df]
    if missing:
        raise ConfigError(f"plot: column {missing[0]!r} is not in the summary")
    groups = (
        [("all", df)]
        if curve_by is None
        else [(f"{curve_by}={k}", g) for k, g in df.groupby(curve_by, sort=True, dropna=False)]
    )
    for label, g in groups:
        yield label, g.groupby(x, sort=True)[list(ys)].mean(numeric_only=True).reset_index()


def log2_x(ax) -> None:
    """A base-2 log x axis labelled with plain numbers (8, 16, 32 rather than 2^3 ...)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _finish(ax, xlabel: str, ylabel: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, linestyle="--", linewidth=0.5, alpha=0.6)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_kv_timeline(
    timelines: dict[str, pd.DataFrame], title: str, max_points: int = 1500
) -> Figure:
    """Stacked areas of the KV split over time, one panel per policy (vLLM paper, Fig. 2).

    Panels with more than `max_points` steps show evenly spaced steps (drawing speed)."""
    fig, axes = new_figure(len(timelines), 1, width=8.0, height=2.2, sharex=True)
    cols = [*WASTE_COLUMNS, "kv_free_frac"]
    for ax, (name, tl) in zip(axes, timelines.items(), strict=True):
        if len(tl) > max_points:
            tl = tl.iloc[np.linspace(0, len(tl) - 1, max_points).astype(np.int64)]
        ax.stackplot(
            tl["time_s"],
            *(100.0 * tl[c] for c in cols),
            step="post",
            labels=[WASTE_LABELS[c] for c in cols],
            colors=[WASTE_COLORS[c] for c in cols],
            rasterized=True,
        )  # small SVG
        ax.set_ylim(0, 100)
        ax.set_title(name, fontsize=10, loc="left")
        _finish(ax, "", "KV memory (%)", legend=False)
    axes[-1].set_xlabel("Simulated time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=5, fontsize=8)
    fig.suptitle(title)
    return fig


def plot_waste_bars(table: pd.DataFrame, title: str) -> Figure:
    """Stacked bars of the time-weighted KV split per allocator (rows of `table`)."""
    fig, (ax,) = new_figure(width=7.0)
    bottom = np.zeros(len(table))
    for c in [*WASTE_COLUMNS, "kv_free_frac"]:
        vals = 100.0 * table[c].astype(float).to_numpy()
        ax.bar(
            table.index.astype(str),
            vals,
            bottom=bottom,
            label=WASTE_LABELS[c],
            color=WASTE_COLORS[c],
        )
        bottom += vals
    ax.set_ylim(0, 100)
    _finish(ax, "KV allocator", "KV memory, time-weighted (%)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    return fig


def plot_latency_vs_rate(
    df: pd.DataFrame,
    *,
    curve_by: str | None = None,
    metrics: Sequence[str] = ("ttft", "tpot", "e2el"),
    stats: Sequence[str] = ("median", "p99"),
    title: str | None = None,
) -> Figure:
    """Latency percentiles (ms) against request rate, one panel per metric."""
    fig, axes = new_figure(1, len(metrics), width=4.6)
    for ax, m in zip(axes, metrics, strict=True):
        ys = [f"{s}_{m}_ms" for s in stats]
        for k, (label, g) in enumerate(_curves(df, "request_rate", ys, curve_by)):
            for y, style in zip(ys, ("-o", "--s", ":^", "-.v"), strict=False):
                ax.plot(
                    g["request_rate"],
                    g[y],
                    style,
                    ms=4,
                    color=f"C{k % 10}",
                    label=f"{label} {y.split('_')[0]}" if curve_by else y.split("_")[0],
                )
        _finish(ax, "Request rate (req/s)", f"{m.upper()} (ms)")
        ax.set_yscale("log")
    fig.suptitle(title or describe(df, "Latency vs request rate"))
    return fig


def plot_block_size_curves(
    df: pd.DataFrame, *, curve_by: str | None = None, title: str | None = None
) -> Figure:
    """Throughput, TTFT, TPOT, internal waste and prefix hit rate against block size.

    Internal waste is every allocated slot that holds no token: the accountant's reservation
    (the unfilled tail of a request's last block, filled as it decodes) plus its internal
    fragmentation (slots never filled)."""
    panels = [
        ("output_throughput", "Output throughput (tok/s)", 1.0),
        ("p99_ttft_ms", "P99 TTFT (ms)", 1.0),
        ("p99_tpot_ms", "P99 TPOT (ms)", 1.0),
        ("kv_unfilled_frac", "Allocated, empty KV slots (%)", 100.0),
        ("prefix_cache_hit_rate", "Prefix cache hit rate (%)", 100.0),
    ]
    df = df.assign(kv_unfilled_frac=df["kv_reserved_frac"] + df["kv_internal_frag_frac"])
    fig, axes = new_figure(1, len(panels), width=3.6, height=3.6)
    for ax, (col, label, scale) in zip(axes, panels, strict=True):
        for name, g in _curves(df, "block_size", [col], curve_by):
            ax.plot(g["block_size"], scale * g[col], "-o", ms=4, label=name)
        log2_x(ax)
        _finish(ax, "Block size (tokens)", label, legend=curve_by is not None)
    fig.suptitle(title or describe(df, "Block size trade-off"))
    return fig


def plot_prefix_hit_vs_cache(
    df: pd.DataFrame,
    *,
    x: str = "num_gpu_blocks_override",
    curve_by: str | None = "block_size",
    xlabel: str | None = None,
    title: str | None = None,
) -> Figure:
    """Prefix cache hit rate (% of prompt tokens) against KV cache size."""
    fig, (ax,) = new_figure()
    for name, g in _curves(df, x, ["prefix_cache_hit_rate"], curve_by):
        ax.plot(g[x], 100.0 * g["prefix_cache_hit_rate"], "-o", ms=4, label=name)
    ax.set_xscale("log")
    _finish(ax, xlabel or "KV cache size (blocks)", "Prefix cache hit rate (% of tokens)")
    ax.set_title(title or describe(df, "Prefix hit rate vs cache size"))
    return fig


def plot_preemption_vs_load(
    df: pd.DataFrame,
    *,
    x: str = "request_rate",
    curve_by: str | None = "preemption_mode",
    title: str | None = None,
) -> Figure:
    """Preemptions and swapped bytes (GiB, out + in) against load."""
    fig, axes = new_figure(1, 2, width=5.0)
    d = _ok(df).copy()
    d["swapped_gib"] = (d["swapped_out_bytes"] + d["swapped_in_bytes"]) / 2**30
    for ax, (col, label) in zip(
        axes,
        (("num_preemptions", "Preemptions"), ("swapped_gib", "Swapped, out + in (GiB)")),
        strict=True,
    ):
        for name, g in _curves(d, x, [col], curve_by):
            ax.plot(g[x], g[col], "-o", ms=4, label=name)
        _finish(ax, "Request rate (req/s)" if x == "request_rate" else x, label)
    fig.suptitle(title or describe(df, "Preemption under memory pressure"))
    return fig


def pareto_points(df: pd.DataFrame, num_replicas_col: str = "num_replicas") -> pd.DataFrame:
    """tokens/s/user = output_throughput / concurrency and tokens/s/GPU = output_throughput /
    (tensor_parallel_size x replicas), as vLLM's plot_pareto. Concurrency is max_concurrency
    when set, else the mean number of requests in flight (Little's law: request_throughput x
    mean E2E latency), which is what a rate-driven run's users amount to."""
    d = _ok(df).copy()
    little = d["request_throughput"] * d["mean_e2el_ms"] / 1000.0
    conc = d["max_concurrency"] if "max_concurrency" in d else pd.Series(np.nan, d.index)
    d["concurrency"] = conc.astype(float).where(conc.notna(), little)
    replicas = d[num_replicas_col] if num_replicas_col in d else 1
    gpus = d.get("tensor_parallel_size", 1) * replicas
    d["tokens_per_user"] = d["output_throughput"] / d["concurrency"]
    d["tokens_per_gpu"] = d["output_throughput"] / gpus
    return d


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """Points no other point beats on both axes, by tokens/s/user."""
    order = points.sort_values(["tokens_per_user", "tokens_per_gpu"], ascending=False)
    keep, best = [], -math.inf
    for idx, y in order["tokens_per_gpu"].items():
        if y > best:
            keep.append(idx)
            best = y
    return points.loc[keep].sort_values("tokens_per_user")


def plot_pareto(
    df: pd.DataFrame, *, label_by: str | None = None, title: str | None = None
) -> Figure:
    """All runs and their Pareto front: tokens/s/user (x) vs tokens/s/GPU (y)."""
    pts = pareto_points(df)
    front = pareto_front(pts)
    fig, (ax,) = new_figure()
    groups = (
        [("all runs", pts)]
        if label_by is None
        else [(f"{label_by}={k}", g) for k, g in pts.groupby(label_by, sort=True)]
    )
    for name, g in groups:
        ax.scatter(g["tokens_per_user"], g["tokens_per_gpu"], s=18, alpha=0.7, label=name)
    ax.plot(
        front["tokens_per_user"],
        front["tokens_per_gpu"],
        "-",
        color="black",
        lw=1.2,
        label="Pareto front",
    )
    _finish(ax, "Output tokens/s per user", "Output tokens/s per GPU")
    ax.set_title(title or describe(df, "Pareto front"))
    return fig
