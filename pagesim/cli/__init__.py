"""The `pagesim` command line (typer). Commands live one per module; `app` gathers them."""

from pagesim.cli.app import app, main

__all__ = ["app", "main"]
