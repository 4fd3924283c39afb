"""pagesim imports and simulates with torch, triton (and, for the core, simpy) unavailable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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
    src = BLOCKER % {'names': sorted(blocked)} + textwrap.dedent(code)
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
