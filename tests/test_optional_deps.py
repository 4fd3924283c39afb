"""pagesim imports and simulates with torch, triton (and, for the core, simpy) unavailable."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

BLOCKER = """
import sys
class _Block:
    def __init__(self, names): self.names = names
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in self.names:
            raise ImportError(name + ' is blocked in this test')
        return None
sys.meta_path.insert(0, _Block(%(names)r))
"""


def _run(code: str, blocked: set[str]) -> subprocess.CompletedProcess:
    src = BLOCKER % {"names": sorted(blocked)} + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=120)


def test_core_imports_without_torch_triton_simpy() -> None:
    res = _run(
        """
        import pagesim, pagesim.kvcache, pagesim.scheduler, pagesim.config, pagesim.request
        import pagesim.kvcache.block_table
        print('ok')
        """,
        {"torch", "triton", "simpy"},
    )
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout


def _pagesim_imports(script: Path) -> list[str]:
    """Every pagesim module a script imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(script.read_text(), filename=str(script))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return sorted(n for n in names if n.split(".")[0] == "pagesim")


GPU_SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if "import torch" in p.read_text())


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=lambda p: p.name)
def test_gpu_scripts_import_without_simpy_and_typer(script: Path) -> None:
    """The GPU machine has torch and triton but neither SimPy nor typer: every pagesim module
    a script that runs there imports must load without them (gpu_session.py once took its
    list parser from the CLI package and failed there before any GPU work)."""
    pytest.importorskip("torch")
    modules = _pagesim_imports(script)
    res = _run("\n".join(f"import {m}" for m in modules) + "\nprint('ok')", {"simpy", "typer"})
    assert res.returncode == 0, f"{script.name}: {res.stderr.strip().splitlines()[-1:]}"
    assert "ok" in res.stdout
