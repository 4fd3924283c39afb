"""The validation report's figure: error % per summary metric, one bar per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pagesim.validate.compare import SUMMARY_METRICS, TARGETS_PCT


def plot_errors(entries: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: error % per summary metric, one bar per run, target bands shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(SUMMARY_METRICS)
    n = max(1, len(entries))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(metrics)), 4.5))
    for j, m in enumerate(metrics):
        t = TARGETS_PCT[m]
        ax.fill_between([j - 0.45, j + 0.45], -t, t, color="0.9", zorder=0)
    for i, e in enumerate(entries):
        by = {r["metric"]: r["error_pct"] for r in e["rows"]}
        xs = [j - 0.4 + (i + 0.5) * width for j in range(len(metrics))]
        ys = [max(-60.0, min(60.0, by.get(m, 0.0))) for m in metrics]
        rate = e["load"]["request_rate"]
        arrivals = "its own arrivals" if rate is None else f"{rate} req/s"
        ax.bar(
            xs,
            ys,
            width,
            color=plt.cm.tab20(i % 20),
            label=f"{e['model']} bs{e['block_size']} {e['load']['workload']} @ {arrivals}",
        )
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels([m.replace("_ms", "") for m in metrics], rotation=30, ha="right")
    ax.set_ylabel("predicted vs real, % (clipped at ±60)")
    ax.set_title("pagesim simulator vs real GPU runs (grey: target band)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
