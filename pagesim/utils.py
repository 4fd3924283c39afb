"""Small helpers that both the CLI and the GPU machine's scripts need.

The GPU machine has torch and triton but neither SimPy nor typer, so a helper that its
scripts share with the CLI lives here, in the first row of the layer table, rather than in
`pagesim.cli` (whose package imports typer and the simulator).
"""

from __future__ import annotations

from pagesim.errors import ConfigError

__all__ = ["parse_int_list"]


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    """`"8,16,32"` -> (8, 16, 32); one-line error naming the option otherwise."""
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--{name} {text!r}: expected integers like 8,16,32") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--{name} {text!r}: expected integers >= 1")
    return values
