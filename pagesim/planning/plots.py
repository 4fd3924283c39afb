"""Figures from sweep summaries and runs (matplotlib, Agg canvas, PNG and SVG).

Every function takes tidy data (a sweep summary: one row per run, see `summary.py`) and
returns a `matplotlib.figure.Figure` drawn on an Agg canvas, so nothing depends on a display
or on pyplot's global state. Runs of one point (seeds) are averaged. Titles name the model,
the GPU and the workload found in the data; axes carry units.
"""

from __future__ import annotations

import math
import textwrap
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


def wrap_title(text: str, width: int = 72) -> str:
    """A title broken into lines of at most `width` characters (its own line breaks kept), so
    that no title is cut off at the figure's edge."""
    return "\n".join(textwrap.fill(line, width) for line in text.splitlines())


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
    """`llama-2-7b on h200, workload chat` from the data's model, gpu and workload columns;
    with `extra`, that below it on a line of its own."""

    def values(col: str) -> str:
        if col not in df:
            return "?"
        vals = sorted({str(v) for v in df[col].dropna()})
        return ", ".join(vals) if len(vals) <= 3 else f"{len(vals)} {col}s"

    text = f"{values('model')} on {values('gpu')}, workload {values('workload')}"
    return f"{extra}\n{text}" if extra else text


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
        else [
            (setting_label(curve_by, k), g)
            for k, g in df.groupby(curve_by, sort=True, dropna=False)
        ]
    )
    for label, g in groups:
        yield label, g.groupby(x, sort=True)[list(ys)].mean(numeric_only=True).reset_index()


def log2_x(ax) -> None:
    """A base-2 log x axis labelled with plain numbers (8, 16, 32 rather than 2^3 ...)."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def log_y(ax) -> None:
    """A log y axis ticked with plain numbers (20,000 rather than 2 x 10^4)."""
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 10 else f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)


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
    fig.suptitle(wrap_title(title))
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
    fig.suptitle(wrap_title(title, 64))
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
        log_y(ax)
    fig.suptitle(wrap_title(title or describe(df, "Latency vs request rate")))
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
    fig.suptitle(wrap_title(title or describe(df, "Block size trade-off")))
    return fig


# Cache-size columns a prefix figure can have on its x axis: (axis label, divisor).
CACHE_AXES: dict[str, tuple[str, float]] = {
    "num_gpu_blocks_override": ("KV cache size (blocks)", 1.0),
    "kv_cache_memory_bytes": ("KV cache memory (GiB)", float(2**30)),
    "gpu_memory_utilization": ("GPU memory utilization (fraction)", 1.0),
}


def plot_prefix_hit_vs_cache(
    df: pd.DataFrame,
    *,
    x: str = "num_gpu_blocks_override",
    curve_by: str | None = "block_size",
    xlabel: str | None = None,
    title: str | None = None,
) -> Figure:
    """Prefix cache hit rate (% of prompt tokens) against KV cache size, ticked at the sizes
    run (bytes shown in GiB)."""
    label, scale = CACHE_AXES.get(x, (x, 1.0))
    fig, (ax,) = new_figure()
    ticks: set[float] = set()
    for name, g in _curves(df, x, ["prefix_cache_hit_rate"], curve_by):
        xs = g[x].astype(float) / scale
        ticks.update(xs)
        ax.plot(xs, 100.0 * g["prefix_cache_hit_rate"], "-o", ms=4, label=name)
    ax.set_xscale("log")
    ax.set_xticks(sorted(ticks), [f"{t:.3g}" for t in sorted(ticks)])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    _finish(ax, xlabel or label, "Prefix cache hit rate (% of tokens)")
    ax.set_title(wrap_title(title or describe(df, "Prefix hit rate vs cache size"), 60))
    return fig


def plot_preemption_vs_load(
    df: pd.DataFrame,
    *,
    x: str = "request_rate",
    curve_by: str | None = "preemption_mode",
    title: str | None = None,
) -> Figure:
    """Preemptions and swapped bytes (GiB, out + in) against load."""
    d = _ok(df).copy()
    d["swapped_gib"] = (d["swapped_out_bytes"] + d["swapped_in_bytes"]) / 2**30
    panels = [
        (col, label)
        for col, label in (
            ("num_preemptions", "Preemptions"),
            ("swapped_gib", "Swapped, out + in (GiB)"),
        )
        if d[col].abs().sum() > 0  # a panel of zeros says nothing: left out
    ] or [("num_preemptions", "Preemptions")]
    fig, axes = new_figure(1, len(panels), width=5.0)
    for ax, (col, label) in zip(axes, panels, strict=True):
        for name, g in _curves(d, x, [col], curve_by):
            ax.plot(g[x], g[col], "-o", ms=4, label=name)
        if x == "request_rate" and d[x].max() > 4 * d[x].min() > 0:  # rates far apart
            rates = sorted(d[x].unique())
            ax.set_xscale("log", base=2)
            ax.set_xticks(rates, [f"{r:.3g}" for r in rates])
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        _finish(ax, "Request rate (req/s)" if x == "request_rate" else x, label)
    fig.suptitle(wrap_title(title or describe(df, "Preemption under memory pressure")))
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


def setting_label(column: str, value) -> str:
    """A setting as a reader says it: `4 req/s`, `2.79 GiB KV`, `block 32`, `oracle`."""
    if column == "request_rate":
        return "inf req/s" if value == math.inf else f"{float(value):g} req/s"
    if column == "kv_cache_memory_bytes":
        return f"{float(value) / 2**30:.3g} GiB KV"
    if column == "block_size":
        return f"block {value}"
    if column == "max_concurrency":
        return f"{value} users"
    if column in ("allocator", "workload", "preemption_mode", "scheduling_policy", "curve"):
        return str(value)
    return f"{column} {value}"


def plot_pareto(
    df: pd.DataFrame,
    *,
    label_by: str | None = None,
    label_points: Sequence[str] = (),
    title: str | None = None,
) -> Figure:
    """Runs and their Pareto fronts, tokens/s/user (x) vs tokens/s/GPU (y): one front per
    workload (a front across workloads would compare different traffic), points coloured by
    `label_by` (default: the workload) and each labelled with its `label_points` settings."""
    pts = pareto_points(df)
    group = label_by or ("workload" if "workload" in pts else None)
    fig, (ax,) = new_figure(width=7.0, height=4.8)
    groups = [("all runs", pts)] if group is None else list(pts.groupby(group, sort=True))
    for k, (name, g) in enumerate(groups):
        shown = name if group in (None, "workload") else setting_label(str(group), name)
        ax.scatter(
            g["tokens_per_user"], g["tokens_per_gpu"], s=18, alpha=0.7, color=f"C{k}", label=shown
        )
    by_workload = "workload" in pts and group == "workload"
    fronts = list(pts.groupby("workload", sort=True)) if "workload" in pts else [("", pts)]
    mid = (pts["tokens_per_user"].min() + pts["tokens_per_user"].max()) / 2
    for k, (name, g) in enumerate(fronts):
        front = pareto_front(g)
        color = f"C{k}" if by_workload else "black"
        ax.plot(
            front["tokens_per_user"],
            front["tokens_per_gpu"],
            "-",
            color=color,
            lw=1.2,
            label=f"Pareto front {name}".rstrip(),
        )
        for _, row in front.iterrows():  # the front's points are the choices: say what they are
            text = ", ".join(setting_label(c, row[c]) for c in label_points if c in row)
            if text:
                right = row["tokens_per_user"] > mid  # labels point inwards, never off the axes
                ax.annotate(
                    text,
                    (row["tokens_per_user"], row["tokens_per_gpu"]),
                    fontsize=7,
                    xytext=(-4 if right else 4, 4),
                    textcoords="offset points",
                    ha="right" if right else "left",
                    color=color,
                )
    ax.margins(x=0.05, y=0.1)
    _finish(ax, "Output tokens/s per user", "Output tokens/s per GPU")
    ax.set_title(wrap_title(title or describe(df, "Pareto front per workload"), 70))
    return fig
