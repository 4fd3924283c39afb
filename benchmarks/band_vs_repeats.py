"""Does the band hold the real runs? The mean of each load's repeats against the range the
shipped profile's measured spread gives (`pagesim run`'s band), per headline metric (no GPU).

For every load served two or more times among the stored real runs, the run's traffic is
simulated at the center (the profile as measured) and with every step at the band's two
ends (`pagesim.sim.build.step_time_band`); a metric holds when the real runs' mean lies
within [min, max] of the three predictions. Prints a markdown table and the count.

    python benchmarks/band_vs_repeats.py results/out_of_sample/real/llama-2-7b \\
        results/out_of_sample/real/llama-3-8b

`--gpu NAME`: the runs were served on another GPU than their config names (an H100 lent in
place of an H200, say); they are priced as on NAME, by transfer of the shipped profile
(`pagesim.cost.transfer`) with its widened band, as `pagesim run --gpu NAME` prices them.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

from pagesim.data import calibration_dir
from pagesim.sim.band import HEADLINE
from pagesim.sim.build import band_cost_model, step_time_band
from pagesim.sim.simulate import simulate
from pagesim.validate.compare import base_run_name
from pagesim.validate.store import load_spec, read_real_run, real_run_config, real_run_files


def groups(folder: Path) -> dict[str, list[dict]]:
    """Base run name -> the stored runs of that load (two or more), capacity runs left out."""
    out: dict[str, list[dict]] = {}
    for path in real_run_files(folder):
        name = path.name.split(".")[0]
        if "-inf-" in name and name.startswith("chat-inf"):
            continue
        out.setdefault(base_run_name(name), []).append(read_real_run(path))
    return {k: v for k, v in out.items() if len(v) >= 2}


def check(name: str, docs: list[dict], gpu: str | None = None) -> list[dict]:
    """One row per headline metric: the real mean, the predicted range, whether it holds.
    `gpu`: price the runs as served on that GPU (by transfer) instead of their config's."""
    config = real_run_config(docs[0])
    transfer = gpu is not None
    if transfer:
        config = dataclasses.replace(config, gpu=gpu)
    profile = None if transfer else calibration_dir() / "h200" / config.model
    band = step_time_band(config, profile, transfer=transfer)
    if band is None:
        raise SystemExit(f"{config.gpu}/{config.model}: no band")
    load = load_spec(docs[0]["load"])
    runs = [
        simulate(config, load, cost_model=band_cost_model(config, profile, f, transfer)).result
        for f in (1.0, band.low, band.high)
    ]
    rows = []
    for metric in HEADLINE:
        real = [d["result"].get(metric) for d in docs]
        if any(v is None for v in real):
            continue
        mean = statistics.fmean(real)
        predicted = [r[metric] for r in runs]
        low, high = min(predicted), max(predicted)
        rows.append(
            {
                "load": name,
                "model": config.model,
                "metric": metric,
                "real_mean": mean,
                "real_runs": real,
                "center": predicted[0],
                "low": low,
                "high": high,
                "inside": low <= mean <= high,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--gpu", help="price the runs as served on this GPU, by transfer")
    args = ap.parse_args()
    rows = [
        row
        for f in args.folders
        for name, docs in groups(f).items()
        for row in check(name, docs, args.gpu)
    ]
    print("| model | load | metric | real mean (runs) | predicted (band) | error % | inside |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        runs = ", ".join(f"{v:.4g}" for v in r["real_runs"])
        error = 100 * (r["center"] / r["real_mean"] - 1) if r["real_mean"] else float("nan")
        print(
            f"| {r['model']} | {r['load']} | {r['metric']} | {r['real_mean']:.4g} ({runs}) "
            f"| {r['center']:.4g} ({r['low']:.4g}-{r['high']:.4g}) | {error:+.1f} "
            f"| {'yes' if r['inside'] else 'no'} |"
        )
    inside = sum(r["inside"] for r in rows)
    print(f"\nreal means inside the band: {inside} of {len(rows)}")
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        print(f"  {model}: {sum(r['inside'] for r in mine)} of {len(mine)}")
        for load in sorted({r["load"] for r in mine}):
            of_load = [r for r in mine if r["load"] == load]
            print(f"    {load}: {sum(r['inside'] for r in of_load)} of {len(of_load)}")


if __name__ == "__main__":
    main()
