"""`pagesim fit-report`: how well a calibration profile's cost model predicts steps it has not
seen, what each of its corrections contributes to that, and what its fit leaves on single
long prefills."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagesim.cli import options as o
from pagesim.cli.app import app
from pagesim.errors import ConfigError


@app.command("fit-report")
def fit_report_command(
    profile: Annotated[
        Path | None,
        typer.Option(help="Calibration profile directory [the shipped H200 profile of --model]"),
    ] = None,
    model: Annotated[str, typer.Option(help="Model whose shipped profile to use.")] = "llama-2-7b",
    holdout_fraction: Annotated[
        float, typer.Option(help="Share of each table's rows (per block size) held out of the fit.")
    ] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the held-out draw.")] = 0,
    disable_correction: o.DisableCorrection = None,
) -> None:
    """Fit the calibrated model on part of a profile's measured steps and print its error on the
    rest, per table (MAPE, max and mean error of the device step time); then the MAPE on the
    same held-out rows with each correction off in turn; then the single-prefill bias the full
    fit takes at 1,024 and 8,192 new tokens per measured block size."""
    from pagesim.config import EngineConfig
    from pagesim.cost.calibrated import CalibratedCostModel
    from pagesim.cost.fit import contributions_markdown, correction_contributions, fit_report
    from pagesim.cost.profile import Profile
    from pagesim.sim.build import default_profile

    if profile is None:
        profile = default_profile(EngineConfig.create(model=model, gpu="h200"))
        if profile is None:
            raise ConfigError(f"model={model!r}: no shipped H200 profile; pass --profile")
    loaded = Profile.load(profile)
    off = tuple(disable_correction or ())
    report = fit_report(loaded, holdout_fraction, seed, disabled_corrections=off)
    print(f"profile: {profile} ({loaded.metadata.model} on {loaded.metadata.gpu})")
    print(
        f"held out: {holdout_fraction:.0%} of each table per block size, seed {seed}; "
        "error of the predicted device step time, %"
        + (f"; corrections off: {', '.join(off)}" if off else "")
    )
    print(report.to_markdown())
    print("\neach correction off alone, the same held-out rows (MAPE %, pagesim.cost.corrections):")
    print(contributions_markdown(correction_contributions(loaded, holdout_fraction, seed)))
    bias = CalibratedCostModel(loaded, disabled_corrections=off).fits["prefill_bias"]
    if bias:
        print(
            "\nsingle-prefill bias (a one-prefill eager step's factor less 1, "
            "pagesim.cost.corrections.prefill_bias):"
        )
        for bs, line in bias.items():
            print(
                f"  block {bs}: {100 * line(1024):+.1f} % at 1,024 new tokens, "
                f"{100 * line(8192):+.1f} % at 8,192"
            )
