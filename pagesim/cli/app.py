"""The typer application and the one place where errors become exit codes.

Bad input of any kind (a `PagesimError`, a malformed flag) prints one line naming the problem
and exits with code 2; a traceback is reserved for bugs.
"""

from __future__ import annotations

import re
import sys
import traceback
from typing import TYPE_CHECKING, Any

import typer

from pagesim.errors import InternalError, PagesimError

if TYPE_CHECKING:
    from pagesim.config import EngineConfig

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
        migrate_profile,
        models,
        parity,
        plan,
        plot,
        run,
        sweep,
        validate,
    )


# Commands that need a GPU, with what works without one. Checked before the commands are
# imported: importing them (pandas, matplotlib) and torch takes seconds, and the answer
# "no GPU here" should not.
GPU_COMMANDS = {
    "calibrate": "",
    "validate": " (--real RUN.json compares stored real runs on any machine)",
}


def gpu_engine_config(model: str | None, **flags: Any) -> EngineConfig:
    """The engine a GPU command measures: the given model (llama-2-7b when none) on this
    machine's GPU (`local_gpu`), so that its predicted KV capacity and vLLM's GPU-dependent
    defaults are that card's."""
    from pagesim.config import EngineConfig

    return EngineConfig.create(model=model or "llama-2-7b", gpu=local_gpu(), **flags)


def local_gpu() -> str:
    """pagesim's name of this machine's first CUDA GPU; the H200, whose profiles ship, where
    there is none or pagesim has no spec of it."""
    try:
        import torch
    except ImportError:
        return "h200"
    if not torch.cuda.is_available():
        return "h200"
    from pagesim.gpu.profiler import gpu_key
    from pagesim.specs import GPUS

    key = gpu_key(torch.cuda.get_device_name(0))
    return key if key in GPUS else "h200"


def _require_gpu_first(argv: list[str] | None) -> None:
    """Fail at once when a GPU command runs on a machine without a GPU (not for --help, nor
    for `validate --real`, which reads stored runs)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] not in GPU_COMMANDS or "--help" in args:
        return
    if args[0] == "validate" and any(a == "--real" or a.startswith("--real=") for a in args):
        return
    from pagesim.gpu import device

    device.require_cuda(GPU_COMMANDS[args[0]])


# Options that take several space-separated items after one flag, as `vllm bench serve
# --goodput ttft:500 tpot:50` does (argparse nargs="+"); click takes one value per flag.
MULTI_ITEM_OPTIONS = ("--goodput", "--slo")
GOODPUT_ITEM = re.compile(r"^(ttft|tpot|e2el):[^\s]+$")


def split_multi_items(args: list[str]) -> list[str]:
    """`--goodput ttft:500 tpot:50` -> `--goodput ttft:500 --goodput tpot:50`: each further
    item of the form METRIC:MS after such a flag gets the flag of its own."""
    out: list[str] = []
    flag: str | None = None  # the multi-item flag whose items may follow
    value_next = False  # the next argument is the flag's own value
    for arg in args:
        if flag is not None and not value_next and GOODPUT_ITEM.match(arg):
            out += [flag, arg]
            continue
        if arg in MULTI_ITEM_OPTIONS:
            flag, value_next = arg, True
        elif value_next:
            value_next = False
        else:
            flag = None
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `pagesim` console script."""
    try:
        _require_gpu_first(argv)
        _register()
        args = split_multi_items(sys.argv[1:] if argv is None else list(argv))
        result = app(args=args, standalone_mode=False)
    except PagesimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except InternalError:
        traceback.print_exc()
        print("internal error: this is a bug in pagesim, please report it", file=sys.stderr)
        return 1
    except typer.Exit as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except (typer.Abort, KeyboardInterrupt):
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
