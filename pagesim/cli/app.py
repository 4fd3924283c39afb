"""The typer application and the one place where errors become exit codes.

Bad input of any kind (a `PagesimError`, a malformed flag) prints one line naming the problem
and exits with code 2; a traceback is reserved for bugs.
"""

from __future__ import annotations

import sys
import traceback

import typer

from pagesim.errors import InternalError, PagesimError

app = typer.Typer(
    name="pagesim",
    help="Simulate and plan LLM serving with a paged KV cache (vLLM v1 semantics).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _usage_error_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes: typer >= 0.25 vendors its own click; older typer uses click's."""
    types: list[type[BaseException]] = []
    if hasattr(typer, "TyperException"):
        types.append(typer.TyperException)
    try:
        import click

        types.append(click.ClickException)
    except ImportError:  # pragma: no cover - typer without click
        pass
    return tuple(types)


@app.callback()
def _root() -> None:
    """Simulate and plan LLM serving with a paged KV cache (vLLM v1 semantics)."""


def _register() -> None:
    """Import the command modules; each adds its commands to `app`."""
    from pagesim.cli import (  # noqa: F401
        calibrate,
        fit_report,
        kv_capacity,
        merge_profiles,
        parity,
        plan,
        plot,
        run,
        sweep,
        validate,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `pagesim` console script."""
    _register()
    try:
        result = app(args=argv, standalone_mode=False)
    except PagesimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except InternalError:
        traceback.print_exc()
        print("internal error: this is a bug in pagesim, please report it", file=sys.stderr)
        return 1
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except _usage_error_types() as exc:  # bad flags, bad values: one line, exit 2
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `pagesim`: the help is the answer
            print(message)
            return 0
        print(f"error: {message}", file=sys.stderr)
        return int(getattr(exc, "exit_code", 2) or 2)
    return result if isinstance(result, int) else 0


def console() -> None:
    """The console script: `main` with the process exit code."""
    sys.exit(main())
