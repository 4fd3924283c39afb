"""Figures of the studies in notebooks/ (the sweep figures are in `plots.py`).

Same conventions: a Figure on an Agg canvas, axes with units, a title naming model, GPU and
workload. `publish` saves PNG where the notebooks' figures go: results/figures/, or a
temporary folder when the notebooks run small (`PAGESIM_NOTEBOOK_SMALL=1`, as in CI), so that
a test run never overwrites the published figures.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from pagesim.planning.plots import _finish, log2_x, log_y, new_figure, save_figure, wrap_title


def small_mode() -> bool:
    """Whether the notebooks run with small parameters (`PAGESIM_NOTEBOOK_SMALL=1`)."""
    return os.environ.get("PAGESIM_NOTEBOOK_SMALL", "") not in ("", "0")


def figures_dir() -> Path:
    """`PAGESIM_FIGURES_DIR`, or a temporary folder in small mode, or results/figures under the
    working folder."""
    given = os.environ.get("PAGESIM_FIGURES_DIR")
    if given:
        return Path(given)
    if small_mode():
        return Path(tempfile.gettempdir()) / "pagesim-figures-small"
    return Path("results") / "figures"


def publish(fig: Figure, stem: str) -> Path:
    """Save `stem`.png under `figures_dir()` (PNG only: the published figures stay small);
    return its path."""
    return save_figure(fig, figures_dir(), stem, ("png",))[0]


def plot_metric_bars(table: pd.DataFrame, metrics: Mapping[str, str], title: str) -> Figure:
    """One bar panel per metric (column -> axis label), a bar per row of `table`."""
    fig, axes = new_figure(1, len(metrics), width=3.6, height=3.6)
    names = [str(i) for i in table.index]
    for ax, (col, label) in zip(axes, metrics.items(), strict=True):
        ax.bar(names, table[col].astype(float), color=[f"C{i}" for i in range(len(names))])
        ax.tick_params(axis="x", rotation=30)
        _finish(ax, "", label, legend=False)
        ax.set_title(label.split(" (")[0], fontsize=10)
    fig.suptitle(wrap_title(title))
    return fig


def plot_step_time_by_block_size(df: pd.DataFrame, title: str) -> Figure:
    """Step time (ms) and relative step time against block size, a line per batch shape."""
    fig, axes = new_figure(1, 2, width=5.0)
    for shape, g in df.groupby("shape", sort=False):
        axes[0].plot(g["block_size"], g["step_time_ms"], "-o", ms=4, label=shape)
        axes[1].plot(g["block_size"], g["relative"], "-o", ms=4, label=shape)
    for ax, label in zip(axes, ("Step time (ms)", "Step time / smallest block's"), strict=True):
        log2_x(ax)
        _finish(ax, "Block size (tokens)", label)
    fig.suptitle(wrap_title(title))
    return fig


def plot_probe_attack(df: pd.DataFrame, title: str) -> Figure:
    """TTFT of the attacker's right and wrong guesses against prefix length, shared vs salted."""
    fig, axes = new_figure(1, 2, width=5.0, sharex=True)
    for ax, (salted, g) in zip(axes, df.groupby("salted", sort=True), strict=True):
        ax.plot(g["prefix_len"], g["wrong_guess_ttft_ms"], "-s", ms=4, label="wrong guess (miss)")
        ax.plot(
            g["prefix_len"],
            g["right_guess_ttft_ms"],
            "--o",
            ms=4,
            label="right guess (victim's prefix)",
        )
        ax.set_title(
            "per-tenant cache_salt" if salted else "shared prefix cache (no salt)", fontsize=10
        )
        _finish(ax, "Victim's prefix length (tokens)", "Attacker's TTFT (ms)")
    fig.suptitle(wrap_title(title))
    return fig


def plot_hit_miss_ttft(records: Mapping[str, pd.DataFrame], title: str) -> Figure:
    """TTFT against prompt length, prefix hits and misses apart, one panel per run."""
    fig, axes = new_figure(1, len(records), width=5.0, sharex=True)
    for ax, (name, df) in zip(axes, records.items(), strict=True):
        for hit, marker, color in ((False, "x", "C3"), (True, "o", "C0")):
            g = df[df["hit"] == hit]
            share = 100.0 * len(g) / max(len(df), 1)
            ax.scatter(
                g["num_prompt_tokens"],
                g["ttft_ms"],
                s=10,
                marker=marker,
                alpha=0.6,
                color=color,
                label=f"{'hit' if hit else 'miss'} ({share:.0f}%)",
            )
        log_y(ax)
        ax.set_title(name, fontsize=10)
        _finish(ax, "Prompt length (tokens)", "TTFT (ms)")
    fig.suptitle(wrap_title(title))
    return fig


def plot_vs_host_link(df: pd.DataFrame, rate: float, title: str) -> Figure:
    """Swap at each host-link bandwidth against recompute, at one request rate."""
    d = df[np.isclose(df["request_rate"], rate)]
    panels = (
        ("output_throughput", "Output throughput (tok/s)"),
        ("p99_ttft_ms", "P99 TTFT (ms)"),
        ("p99_tpot_ms", "P99 TPOT (ms)"),
    )
    fig, axes = new_figure(1, 3, width=4.2)
    for ax, (col, label) in zip(axes, panels, strict=True):
        for k, (bs, g) in enumerate(d.groupby("block_size", sort=True)):
            swap = g[g["preemption_mode"] == "swap"].sort_values("host_link_gbps")
            rec = g[g["preemption_mode"] == "recompute"][col]
            color, gbps = f"C{k}", swap["host_link_gbps"]
            ax.plot(gbps, swap[col], "-o", ms=4, color=color, label=f"swap, block {bs}")
            if len(rec):
                ax.axhline(float(rec.iloc[0]), ls="--", color=color, label=f"recompute, block {bs}")
        log2_x(ax)
        _finish(ax, "Host link bandwidth (GB/s, one way)", label)
    fig.suptitle(wrap_title(title))
    return fig


def plot_grouped_bars(table: pd.DataFrame, metrics: Mapping[str, str], title: str) -> Figure:
    """One panel per metric (column -> axis label); `table` is indexed by (group, name): a
    cluster of bars per name (an allocator), a bar per group (a load) in each cluster."""
    groups = list(dict.fromkeys(table.index.get_level_values(0)))
    names = list(dict.fromkeys(table.index.get_level_values(1)))
    fig, axes = new_figure(1, len(metrics), width=3.8, height=3.8)
    width = 0.8 / len(groups)
    x = np.arange(len(names))
    for ax, (col, label) in zip(axes, metrics.items(), strict=True):
        for k, group in enumerate(groups):
            vals = [float(table.loc[(group, n), col]) for n in names]
            ax.bar(x + (k - (len(groups) - 1) / 2) * width, vals, width, label=str(group))
        ax.set_xticks(x, names)
        ax.tick_params(axis="x", rotation=20)
        _finish(ax, "", label, legend=False)
        ax.set_title(label.split(" (")[0], fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(groups), fontsize=8)
    fig.suptitle(wrap_title(title))
    return fig


def plot_block_size_answer(rows: Mapping[str, list[dict]], title: str) -> Figure:
    """Per workload (a line each), against block size: the max rate within the SLOs, the
    decode step's cost, and at that rate the internal fragmentation and prefix hit rate
    (`blocksize.compare_block_sizes` rows)."""
    panels = (
        ("max_rate", "Max rate within SLOs (req/s)", 1.0),
        ("decode_step_ms", "Decode step, batch 32 x 2048 (ms)", 1.0),
        ("internal_frag", "Internal fragmentation (% of KV)", 100.0),
        ("prefix_hit_rate", "Prefix cache hit rate (%)", 100.0),
    )
    fig, axes = new_figure(1, len(panels), width=3.8, height=3.6)
    for ax, (col, label, scale) in zip(axes, panels, strict=True):
        for name, table in rows.items():
            d = pd.DataFrame(table)
            ax.plot(d["block_size"], scale * d[col].astype(float), "-o", ms=4, label=name)
        log2_x(ax)
        _finish(ax, "Block size (tokens)", label)
    fig.suptitle(wrap_title(title))
    return fig
