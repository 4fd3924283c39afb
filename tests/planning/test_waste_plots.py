"""Allocator comparison and every figure: data right, axes labelled, files written."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from pagesim.config import EngineConfig
from pagesim.planning import plots
from pagesim.planning.grid import build_grid
from pagesim.planning.sweep import run_grid
from pagesim.planning.waste import WASTE_COLUMNS, compare_allocators, fit_gain
from pagesim.sim.simulate import LoadSpec

LOAD = LoadSpec(workload="chat", num_prompts=40, request_rate=20.0)


@pytest.fixture(scope="module")
def comparison():
    config = EngineConfig.create(num_gpu_blocks_override=1024, contiguous_placement="first-fit")
    return compare_allocators(config, LOAD)


def test_paging_wastes_least_and_fits_most(comparison) -> None:
    t = comparison.table
    assert list(t.index) == ["reserve-max", "pow2", "oracle", "paged"]
    parts = t[[*WASTE_COLUMNS, "kv_free_frac"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(1.0, abs=1e-9)
    assert (
        t.loc["paged", "kv_internal_frag_frac"]
        < t.loc["oracle", "kv_internal_frag_frac"]
        < t.loc["pow2", "kv_internal_frag_frac"]
        < t.loc["reserve-max", "kv_internal_frag_frac"]
    )
    assert t.loc["paged", "kv_external_frag_frac"] == 0.0
    assert t["kv_token_state_frac"].idxmax() == "paged"
    gain = fit_gain(t)
    assert gain["paged"] == 1.0 and gain["reserve-max"] > gain["oracle"] > 1.0
    tl = comparison.timelines["reserve-max"]
    assert list(tl.columns) == ["time_s", *WASTE_COLUMNS, "kv_free_frac"]
    assert tl["time_s"].is_monotonic_increasing


def _labelled(fig) -> None:
    assert fig.get_suptitle() or any(ax.get_title() for ax in fig.axes)
    for ax in fig.axes:
        if ax.has_data():
            assert ax.get_ylabel(), ax


@pytest.fixture(scope="module")
def summary() -> pd.DataFrame:
    grid = build_grid(
        {
            "block_size": [8, 16],
            "request_rate": [4.0, 16.0],
            "preemption_mode": ["recompute", "swap"],
        },
        base={"workload": "system-prompt", "num_prompts": 30, "num_gpu_blocks_override": 800},
    )
    return run_grid(grid)


@pytest.mark.slow
def test_every_figure(summary: pd.DataFrame, comparison, tmp_path: Path) -> None:
    title = plots.describe(summary, "Test")
    assert title == "Test\nllama-2-7b on h200, workload system-prompt"
    assert plots.wrap_title("a " * 50, 20).count("\n") == 4  # no line cut off at the edge
    figs = {
        "timeline": plots.plot_kv_timeline(comparison.timelines, "t"),
        "bars": plots.plot_waste_bars(comparison.table, "t"),
        "latency": plots.plot_latency_vs_rate(summary, curve_by="block_size"),
        "block": plots.plot_block_size_curves(summary, curve_by="preemption_mode"),
        "prefix": plots.plot_prefix_hit_vs_cache(summary, x="block_size", curve_by=None),
        "preempt": plots.plot_preemption_vs_load(summary),
        "pareto": plots.plot_pareto(summary, label_by="block_size"),
    }
    for name, fig in figs.items():
        _labelled(fig)
        (png,) = plots.save_figure(fig, tmp_path, name, formats=("png",))
        assert png.read_bytes()[:4] == b"\x89PNG"
    paths = plots.save_figure(figs["pareto"], tmp_path, "pareto")
    assert [p.suffix for p in paths] == [".png", ".svg"]
    assert b"<svg" in paths[1].read_bytes()[:400]
    # the SVG is reproducible byte for byte
    again = plots.save_figure(plots.plot_pareto(summary, label_by="block_size"), tmp_path, "p2")
    assert again[1].read_bytes() == (tmp_path / "pareto.svg").read_bytes()


def test_pareto_axes_as_vllm(summary: pd.DataFrame) -> None:
    pts = plots.pareto_points(summary)
    row = pts.iloc[0]
    conc = row["request_throughput"] * row["mean_e2el_ms"] / 1000.0
    assert row["tokens_per_user"] == pytest.approx(row["output_throughput"] / conc)
    assert row["tokens_per_gpu"] == pytest.approx(row["output_throughput"])
    front = plots.pareto_front(pts)
    assert 1 <= len(front) <= len(pts)
    for _, f in front.iterrows():  # no run beats a front point on both axes
        assert not (
            (pts["tokens_per_user"] > f["tokens_per_user"])
            & (pts["tokens_per_gpu"] > f["tokens_per_gpu"])
        ).any()
    off = pts.drop(front.index)
    for _, p in off.iterrows():  # every other run is beaten by some front point
        assert (
            (front["tokens_per_user"] >= p["tokens_per_user"])
            & (front["tokens_per_gpu"] >= p["tokens_per_gpu"])
        ).any()
    capped = summary.assign(max_concurrency=8)
    assert plots.pareto_points(capped).iloc[0]["tokens_per_user"] == pytest.approx(
        row["output_throughput"] / 8
    )


def test_prefix_axis_in_gib_and_pareto_fronts_per_workload() -> None:
    df = pd.DataFrame(
        {
            "model": "llama-2-7b",
            "gpu": "h200",
            "workload": ["chat", "chat", "code", "code"],
            "kv_cache_memory_bytes": [3 * 2**30, 9 * 2**30] * 2,
            "request_rate": [4.0, 8.0, 4.0, 8.0],
            "prefix_cache_hit_rate": [0.1, 0.2, 0.3, 0.4],
            "request_throughput": [1.0, 2.0, 1.0, 2.0],
            "mean_e2el_ms": [1000.0, 1000.0, 500.0, 500.0],
            "output_throughput": [100.0, 150.0, 80.0, 90.0],
        }
    )
    fig = plots.plot_prefix_hit_vs_cache(df, x="kv_cache_memory_bytes", curve_by="workload")
    (ax,) = fig.axes
    assert ax.get_xlabel() == "KV cache memory (GiB)"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["3", "9"]
    assert sorted(line.get_label() for line in ax.get_lines()) == ["chat", "code"]
    fig = plots.plot_pareto(df, label_points=["request_rate", "kv_cache_memory_bytes"])
    (ax,) = fig.axes
    fronts = [line.get_label() for line in ax.get_lines()]
    assert fronts == ["Pareto front chat", "Pareto front code"]
    labels = {t.get_text() for t in ax.texts}
    assert "8 req/s, 9 GiB KV" in labels and not any("=" in t for t in labels)
