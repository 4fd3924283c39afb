"""Does the band hold the real runs? The mean of each load's repeats against the range the
shipped profile's measured spread gives (`pagesim run`'s band), per headline metric (no GPU).

For every load served two or more times among the stored real runs, the run's traffic is
simulated at the center (the profile as measured) and with every step at the band's two
ends (`pagesim.sim.build.step_time_band`); a metric holds when the real runs' mean lies
within [min, max] of the three predictions. Prints a markdown table and the count.

    python benchmarks/band_vs_repeats.py results/out_of_sample/real/llama-2-7b \\
        results/out_of_sample/real/llama-3-8b

Runs are priced by the shipped profile of the GPU their config names. For a GPU with none
(the H100 runs), `--gpu NAME` prices them as `pagesim run --gpu NAME` does, by transfer of
the shipped H200 profile (`pagesim.cost.transfer`) with its widened band, and `--gpu NAME
--profile DIR` by a profile measured on NAME. With `--write-served`, the largest |error| of
the transfer's mean TPOT over those loads (`worst_mean_tpot_error`) becomes NAME's row of
pagesim/data/transfer/served.csv, which widens every transferred band where it is larger than
the operations' error (`pagesim.cost.transfer_error`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
from pathlib import Path

from pagesim.cost.transfer_error import SERVED_FILE, read_served
from pagesim.data import calibration_dir, transfer_dir
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


def check(
    name: str, docs: list[dict], gpu: str | None = None, profile: Path | None = None
) -> list[dict]:
    """One row per headline metric: the real mean, the predicted range, whether it holds.
    `gpu`: price the runs as served on that GPU instead of their config's: with `profile`
    (measured on that GPU), by it, else by transfer."""
    config = real_run_config(docs[0])
    transfer = gpu is not None and profile is None
    if gpu is not None:
        config = dataclasses.replace(config, gpu=gpu)
    if profile is None and not transfer:
        profile = calibration_dir() / config.gpu / config.model
        if not (profile / "profile.json").is_file():
            raise SystemExit(
                f"{name}: no profile of {config.model} ships for {config.gpu}; "
                "price it with --gpu (by transfer) or --gpu and --profile"
            )
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
                "served_on": docs[0].get("device", {}).get("gpu_name", "?"),
            }
        )
    return rows


def worst_mean_tpot_error(rows: list[dict]) -> float:
    """The largest |center / real mean - 1| of the loads' mean TPOT, in %, to 0.1."""
    tpot = [r for r in rows if r["metric"] == "mean_tpot_ms"]
    if not tpot:
        raise SystemExit("no load with a mean TPOT")
    return round(max(abs(100 * (r["center"] / r["real_mean"] - 1)) for r in tpot), 1)


def write_served(gpu: str, folders: list[Path], rows: list[dict]) -> Path:
    """Replace `gpu`'s row of the shipped served.csv with these runs' largest mean-TPOT
    error (`worst_mean_tpot_error`)."""
    worst = worst_mean_tpot_error(rows)
    cards = sorted({r["served_on"] for r in rows})
    path = transfer_dir() / SERVED_FILE
    table = {g: e._asdict() for g, e in read_served(path).items()}
    table[gpu] = {
        "mean_tpot_pct": worst,
        "served_on": "/".join(cards),
        "runs": " ".join(str(f) for f in folders),
    }
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["gpu", "mean_tpot_pct", "served_on", "runs"])
        writer.writeheader()
        writer.writerows({"gpu": g, **table[g]} for g in sorted(table))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--gpu", help="price the runs as served on this GPU, by transfer")
    ap.add_argument(
        "--profile", type=Path, help="with --gpu: price by this profile (of that GPU) instead"
    )
    ap.add_argument(
        "--write-served",
        action="store_true",
        help="with --gpu: write the transfer's largest mean-TPOT error to served.csv",
    )
    args = ap.parse_args()
    if (args.write_served or args.profile) and not args.gpu:
        ap.error("--write-served and --profile need --gpu")
    if args.write_served and args.profile:
        ap.error("--write-served scores the transfer: not with --profile")
    rows = [
        row
        for f in args.folders
        for name, docs in groups(f).items()
        for row in check(name, docs, args.gpu, args.profile)
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
    if args.write_served:
        print(f"wrote {write_served(args.gpu, args.folders, rows)}")


if __name__ == "__main__":
    main()
