"""`benchmarks/gpu_session.py`'s plan of real runs: later passes repeat the first pass's runs
under new names, at the rates the first pass measures (no GPU needed to check the plan)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_session  # noqa: E402

from pagesim.validate import base_run_name  # noqa: E402


def test_later_passes_repeat_the_chosen_runs_in_the_plans_order() -> None:
    plan = gpu_session.run_plan(dry=False)
    chosen = {"chat-85pct-bs16", "code-85pct-bs16"}
    later = gpu_session.later_passes(plan, 3, chosen)
    assert [s["name"] for s in later] == [
        "chat-85pct-bs16-r2",
        "code-85pct-bs16-r2",
        "chat-85pct-bs16-r3",
        "code-85pct-bs16-r3",
    ]
    by_name = {s["name"]: s for s in plan}
    for spec in later:
        first = by_name[base_run_name(spec["name"])]
        assert {k: v for k, v in spec.items() if k != "name"} == {
            k: v for k, v in first.items() if k != "name"
        }  # rate as a fraction, same `of`
    assert len(gpu_session.later_passes(plan, 2)) == len(plan)
    assert gpu_session.later_passes(plan, 1) == []


def test_an_unknown_pass_run_is_refused_before_any_work(tmp_path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_session.py"),
            "--out",
            str(tmp_path),
            "--passes",
            "2",
            "--pass-runs",
            "chat-99pct",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "chat-99pct" in done.stderr
    assert not any(tmp_path.iterdir())
