"""`pagesim migrate-profile`: a calibration profile of an older format version rewritten in the
current one, which is the only one the reader takes (`pagesim.cost.profile_migrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagesim.cli.app import app
from pagesim.errors import ConfigError
from pagesim.utils import check_output_dir


@app.command("migrate-profile")
def migrate_profile_command(
    profile: Annotated[Path, typer.Argument(help="Calibration profile directory to convert.")],
    output_dir: Annotated[
        Path | None,
        typer.Option("--output-dir", "-o", help="Write the converted profile here [in place]."),
    ] = None,
) -> None:
    """Convert a profile to the current format version; in place unless --output-dir."""
    from pagesim.cost.profile import PROFILE_FORMAT_VERSION
    from pagesim.cost.profile_migrate import migrate_profile

    if output_dir is not None:
        check_output_dir(output_dir, "--output-dir")
        if output_dir.resolve() != profile.resolve() and any(output_dir.glob("*")):
            raise ConfigError(f"--output-dir {output_dir}: not empty; give an empty directory")
    version, _ = migrate_profile(profile, output_dir)
    target = profile if output_dir is None else output_dir
    print(f"{profile}: format_version {version} -> {PROFILE_FORMAT_VERSION}, written to {target}")
