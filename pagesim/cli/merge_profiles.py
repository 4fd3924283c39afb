"""`pagesim merge-profiles`: several calibrations of one setup folded into one profile, each
grid point the median of the sources' measurements (`pagesim.cost.profile_merge`)."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Annotated

import typer

from pagesim.cli.app import app
from pagesim.errors import ConfigError
from pagesim.utils import check_output_dir, make_output_dir


@app.command("merge-profiles")
def merge_profiles_command(
    sources: Annotated[
        list[Path],
        typer.Argument(
            help="Calibration profile directories of one GPU, model and software stack."
        ),
    ],
    output_dir: Annotated[
        Path,
        typer.Option(
            "--output-dir", "-o", help="Profile directory to write (not one of the sources)."
        ),
    ],
    overwrite: Annotated[
        bool, typer.Option(help="Replace a profile already in --output-dir (refused otherwise).")
    ] = False,
) -> None:
    """Write the profile whose every grid point is the median over the sources that measured
    it, and print how far each source's decode rows sat from that median. A GPU session's
    level moves by a few % from one session to the next; the median of several calibrations
    prices a session it has not seen better than any one of them."""
    from pagesim.cost.profile import Profile
    from pagesim.cost.profile_merge import merge_profiles, source_deviation

    out = output_dir.resolve()
    if any(src.resolve() == out for src in sources):
        raise ConfigError(
            f"--output-dir {output_dir}: is one of the sources; write the merged profile elsewhere"
        )
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"--output-dir {output_dir}: is a file, not a directory")
    check_output_dir(output_dir, "--output-dir")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ConfigError(
            f"--output-dir {output_dir}: not empty (holds a profile?); give --overwrite to "
            "replace it"
        )
    loaded = [Profile.load(src) for src in sources]
    merged = merge_profiles(loaded)
    make_output_dir(output_dir, "--output-dir")
    merged.save(output_dir)
    meta = merged.metadata
    print(f"{meta.model} on {meta.gpu}: median of {len(loaded)} calibrations -> {output_dir}")
    print(
        f"  rows: {len(merged.decode)} decode, {len(merged.prefill)} prefill, "
        f"{len(merged.mixed)} mixed, {len(merged.overhead)} overhead"
    )
    print("  each source's decode rows against the merged median (median, min, max %):")
    for src, profile in zip(sources, loaded, strict=True):
        dev = [100 * d for d in source_deviation(profile, merged)]
        print(
            f"    {src} ({profile.metadata.date}): {median(dev):+.1f} "
            f"{min(dev):+.1f} {max(dev):+.1f}"
        )
