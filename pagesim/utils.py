"""Small helpers that both the CLI and the GPU machine's scripts need.

The GPU machine has torch and triton but neither SimPy nor typer, so a helper that its
scripts share with the CLI lives here, in the first row of the layer table, rather than in
`pagesim.cli` (whose package imports typer and the simulator).
"""

from __future__ import annotations

import math
import numbers
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pagesim.errors import ConfigError

__all__ = [
    "MAX_BLOCKS",
    "MAX_COUNT",
    "MAX_TOKENS",
    "atomic_output",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_number",
    "check_output_dir",
    "check_output_file",
    "make_output_dir",
    "parse_int_list",
    "readable",
    "write_new_file",
]


def readable(x: float, digits: int = 4) -> str:
    """A measured figure for a person: `digits` significant digits below 1,000, whole numbers
    with thousands grouped from there (`19,264`, not `1.926e+04`)."""
    if math.isfinite(x) and abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """`"8,16,32"` -> (8, 16, 32); one-line error naming the option otherwise."""
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--{name} {text!r}: expected integers like 8,16,32") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--{name} {text!r}: expected integers >= 1")
    return values


# Bounds on sizes that enter from the user, set by what one machine could hold or what any
# model could serve; each is far above every real setting, so that only an absurd value (a
# typo, an exponent too many) is refused, at the boundary, before any memory is asked for.
MAX_TOKENS = 1 << 24  # one sequence or one step: 16,777,216 tokens, above any model's context
MAX_COUNT = 10_000_000  # requests, sessions, prefix groups or tenants of one run
MAX_BLOCKS = 1 << 24  # KV blocks of one engine (pagesim holds a Python object per block)


def check_number(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    integer: bool = False,
    error: type[Exception] = ConfigError,
    allow_inf: bool = False,
) -> None:
    """Raise `error` with one line naming `name` unless `value` is a finite number (an int if
    `integer`) in [low, high] ((low, high] if `low_open`); `allow_inf`: +inf passes too.

    Called where a value enters (a flag, a file, a spec), never on a hot path.
    """
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name}={value!r}: expected {kind}")
    if integer and not isinstance(value, numbers.Integral):
        raise error(f"{name}={value!r}: expected {kind}")
    if not math.isfinite(value) and not (allow_inf and value == math.inf):
        raise error(f"{name}={value!r}: must be finite")
    number = float(value)  # numbers.Real has no ordering in its stubs
    if low is not None and (number <= low if low_open else number < low):
        raise error(f"{name}={value!r}: must be {'>' if low_open else '>='} {low:g}")
    if high is not None and number > high:
        raise error(f"{name}={value!r}: must be <= {high:,}")


NAME_MAX = 255  # bytes in one path component (Linux, macOS)


def check_output_file(path: str | os.PathLike, flag: str) -> None:
    """Refuse, before any work, an output file that could not be written: a directory in its
    place, a file where a parent folder must be, a folder that is not writable, a name too
    long for the filesystem. Creates nothing."""
    p = Path(path)
    if len(p.name.encode()) > NAME_MAX:
        raise ConfigError(f"{flag} {str(path)[:80]}...: file name longer than {NAME_MAX} bytes")
    if p.is_dir():
        raise ConfigError(f"{flag} {path}: is a directory; give a file name")
    check_output_dir(p.parent, flag, shown=path)


def check_output_dir(path: str | os.PathLike, flag: str, shown: object = None) -> None:
    """The same for a folder that will be created if missing."""
    shown = path if shown is None else shown
    p = Path(path)
    for part in p.parts:
        if len(part.encode()) > NAME_MAX:
            raise ConfigError(f"{flag} {shown}: a folder name longer than {NAME_MAX} bytes")
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {shown}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {shown}: {existing} is not writable")


def make_output_dir(path: str | os.PathLike, flag: str, shown: object = None) -> None:
    """Create an output folder before any work, or a one-line error naming it: the checks of
    `check_output_dir` first (their messages say why), then mkdir, which checks alone cannot
    stand for: under /proc, say, every check passes and mkdir still fails."""
    check_output_dir(path, flag, shown)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f"{path}: cannot create" if shown is None else f"{shown}: cannot create {path}"
        raise ConfigError(f"{flag} {where} ({exc.strerror})") from None


@contextmanager
def _temporary_beside(path: Path) -> Iterator[str]:
    """The name of a new empty temporary file beside `path`; removed on exit (after a rename
    it is gone already)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    # mkstemp makes the file private (0600); the result should be as open as any file the
    # user writes (0666 less the umask), as `open(path, "w")` would make it
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextmanager
def _complete_temporary(path: Path, data: bytes) -> Iterator[str]:
    """A temporary file beside `path` that already holds all of `data`."""
    with _temporary_beside(path) as tmp:
        Path(tmp).write_bytes(data)
        yield tmp


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[str]:
    """A temporary file name to write `path`'s content to, piece by piece; renamed onto
    `path` when the block ends without an error, so that `path` is never torn."""
    p = Path(path)
    with _temporary_beside(p) as tmp:
        yield tmp
        os.replace(tmp, p)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename, so
    that a reader (or `--resume`) sees the old file or the whole new one, never a torn one."""
    p = Path(path)
    with _complete_temporary(p, data) as tmp:
        os.replace(tmp, p)


def write_new_file(path: str | os.PathLike, data: bytes) -> bool:
    """Write `data` to `path` atomically only if no file is there (a hard link of a complete
    temporary file, which fails when the name is taken); False if it was taken."""
    p = Path(path)
    with _complete_temporary(p, data) as tmp:
        try:
            os.link(tmp, p)
        except FileExistsError:
            return False
    return True


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`atomic_write_bytes` of UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))
