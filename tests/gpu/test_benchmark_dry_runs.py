"""GPU benchmark scripts run end to end on the CPU (`--dry-run-cpu`: the tiny model under the
Triton interpreter), with their default --models, and write their CSV."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPTS = [
    ("heavy_after_light.py", ["--rounds", "1"], "heavy_after_light.csv"),
    (
        "decode_in_run.py",
        ["--batches", "1,2", "--prompts", "16", "--repeats", "2"],
        "decode_in_run.csv",
    ),
    ("runner_host.py", [], "runner_host.csv"),
]


@pytest.mark.parametrize(("script", "args", "csv"), SCRIPTS, ids=[s[0] for s in SCRIPTS])
def test_dry_run_writes_its_table(script, args, csv, tmp_path) -> None:
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
    }
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            "--dry-run-cpu",
            "--out",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / csv).read_text().splitlines()
    assert len(lines) > 1 and {"llama-2-7b", "llama-3-8b"} <= {line.split(",")[0] for line in lines}
