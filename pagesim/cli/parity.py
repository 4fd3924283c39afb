"""`pagesim parity`: replay vLLM's recorded decisions through pagesim and report the first
divergence (see docs/parity.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pagesim.cli.app import app


@app.command("parity")
def parity_command(
    golden: Annotated[
        list[Path] | None, typer.Argument(help="Golden decision files [all shipped ones]")
    ] = None,
    block_ids: Annotated[
        str, typer.Option(help="exact | renamed (allow one consistent renaming of block ids)")
    ] = "exact",
) -> int:
    """Check pagesim's scheduler and KV cache against decisions recorded from vLLM."""
    from pagesim.errors import ConfigError
    from pagesim.parity import golden_files, run_parity

    if block_ids not in ("exact", "renamed"):
        raise ConfigError(f"--block-ids {block_ids!r}: choose exact or renamed")
    files = golden or golden_files()
    if not files:
        raise ConfigError("no golden files found: nothing to check")
    failed = 0
    for path in files:
        if not Path(path).is_file():
            raise ConfigError(f"golden file {path}: no such file")
        report = run_parity(path, block_ids=block_ids)
        status = "match" if report.ok else "DIVERGES"
        print(f"{status:<9} {Path(path).name}")
        if not report.ok:
            failed += 1
            print(report.format())
    print(f"{len(files) - failed} of {len(files)} golden files match")
    return 1 if failed else 0
