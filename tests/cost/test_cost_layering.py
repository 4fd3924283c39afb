"""pagesim.cost imports only what DESIGN.md section 2 allows: scheduler.output, the first row
(errors, specs, config, request, utils), itself, numpy and the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pagesim.cost

ALLOWED_PAGESIM = (
    "pagesim.cost",
    "pagesim.scheduler.output",
    "pagesim.errors",
    "pagesim.specs",
    "pagesim.config",
    "pagesim.request",
    "pagesim.utils",
)


def imported_modules(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_cost_imports_follow_the_layer_table():
    files = sorted(Path(pagesim.cost.__file__).parent.rglob("*.py"))
    assert len(files) >= 5
    for f in files:
        for name in imported_modules(f):
            top = name.split(".")[0]
            if top == "pagesim":
                assert name.startswith(ALLOWED_PAGESIM), f"{f.name} imports {name}"
            else:
                assert top == "numpy" or top in sys.stdlib_module_names or top == "__future__", (
                    f"{f.name} imports {name}"
                )
