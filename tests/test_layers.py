"""The layer table of DESIGN.md, enforced by parsing every module's imports.

kvcache and scheduler never see SimPy, torch, `sim` or `gpu`: that is what lets one allocator
and one scheduler run in both the simulator and the GPU runner.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "pagesim"
FIRST_ROW = {"errors", "specs", "hf_config", "config", "request", "utils", "data", "__init__"}

# layer -> (pagesim packages it may import, third-party roots it may import)
ALLOWED: dict[str, tuple[set[str], set[str]]] = {
    "first_row": (FIRST_ROW, {"numpy"}),
    "kvcache": (FIRST_ROW | {"kvcache"}, set()),
    "scheduler": (FIRST_ROW | {"kvcache", "scheduler"}, set()),
    "workload": (FIRST_ROW | {"kvcache", "workload"}, {"numpy", "pandas", "yaml"}),
    "cost": (FIRST_ROW | {"scheduler", "cost"}, {"numpy"}),
    "metrics": (FIRST_ROW | {"metrics"}, {"numpy"}),
    "sim": (
        FIRST_ROW | {"kvcache", "scheduler", "workload", "cost", "sim", "metrics"},
        {"simpy", "numpy", "pandas", "pyarrow"},
    ),
    "gpu": (
        FIRST_ROW | {"kvcache", "scheduler", "workload", "cost", "gpu", "metrics"},
        {"torch", "triton", "numpy"},
    ),
    "planning": (
        FIRST_ROW | {"sim", "cost", "workload", "kvcache", "planning", "scheduler", "metrics"},
        {"pandas", "matplotlib", "joblib", "numpy", "rich", "ray", "yaml", "pyarrow"},
    ),
    "parity": (
        FIRST_ROW | {"kvcache", "scheduler", "workload", "parity"},
        {"numpy", "vllm", "torch"},
    ),
}
STDLIB = set(__import__("sys").stdlib_module_names) | {"__future__"}
# The CLI and the validation report sit above everything; they import gpu only lazily.
TOP = {"cli", "validate", "__main__"}


def _layer(path: Path) -> str | None:
    rel = path.relative_to(ROOT)
    head = rel.parts[0].removesuffix(".py")
    if head in TOP:
        return None
    if head in FIRST_ROW:
        return "first_row"
    return head


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module, line, is_top_level) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, node.lineno, id(node) in top_level))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno, id(node) in top_level))
    return found


MODULES = sorted(p for p in ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_respects_layer_table(path: Path) -> None:
    layer = _layer(path)
    if layer is None:
        return
    assert layer in ALLOWED, f"{path}: package {layer!r} is missing from the layer table"
    ours, third_party = ALLOWED[layer]
    for module, line, _ in _imports(path):
        root = module.split(".")[0]
        where = f"{path.relative_to(ROOT.parent)}:{line} imports {module}"
        if root == "pagesim":
            sub = module.split(".")[1] if "." in module else "__init__"
            assert sub in ours, f"{where}: layer {layer} may not import pagesim.{sub}"
        else:
            assert root in STDLIB or root in third_party, (
                f"{where}: layer {layer} may not import {root}"
            )


def test_every_package_is_in_the_table() -> None:
    heads = {_layer(p) for p in MODULES} - {None}
    assert heads <= set(ALLOWED)
