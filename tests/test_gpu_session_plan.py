"""`benchmarks/gpu_session.py`'s plan of real runs: later passes repeat the first pass's runs
under new names, at the rates the first pass measures (no GPU needed to check the plan)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_session  # noqa: E402

from pagesim.validate.compare import base_run_name  # noqa: E402


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


def test_the_serve_plan_serves_every_block_size_and_each_load_kind_twice() -> None:
    """Call B: chat at 85 % on blocks 8-128, bursty chat, multi-turn, bwb and a trace replay,
    each twice (the repeat after the whole first pass); call A serves nothing."""
    plan = gpu_session.run_plan(dry=False, plan="serve")
    names = [s["name"] for s in plan]
    assert len(names) == len(set(names)) and names[0] == "chat-inf-bs16"
    firsts = [s for s in plan[1:] if not s["name"].endswith("-r2")]
    assert [s["name"] + "-r2" for s in firsts] == [s["name"] for s in plan[1 + len(firsts) :]]
    chat85 = {s["block_size"] for s in firsts if s["name"].startswith("chat-85pct")}
    assert chat85 == {8, 16, 32, 64, 128}
    kinds = {s["workload"] for s in firsts}
    assert {"chat", "multi-turn", "bwb", "conversation"} <= kinds
    assert any(s.get("burstiness") == 0.5 for s in firsts)
    assert gpu_session.run_plan(dry=False, plan="calibrate") == []


def test_a_dry_serve_plan_keeps_each_runs_shape_with_tiny_loads() -> None:
    real = gpu_session.run_plan(dry=False, plan="serve")
    dry = gpu_session.run_plan(dry=True, plan="serve")
    assert [s["name"] for s in dry] == [s["name"] for s in real]
    for r, d in zip(real, dry, strict=True):
        for key in ("block_size", "rate", "burstiness"):
            assert d.get(key) == r.get(key)
        if r["workload"] == "multi-turn":
            assert d["workload"] == gpu_session.DRY_MULTI_TURN
        elif r["rate"] is None:
            assert d["workload"] == gpu_session.DRY_TRACE
        else:
            assert d["workload"] == "random"


def test_the_dry_workloads_load_as_a_multi_turn_spec_and_a_trace(tmp_path) -> None:
    from pagesim.workload import load_workload

    gpu_session.write_dry_workloads(tmp_path)
    plan = load_workload(str(tmp_path / gpu_session.DRY_MULTI_TURN)).sample(6, seed=0)
    assert plan.is_multi_turn
    trace = load_workload(str(tmp_path / gpu_session.DRY_TRACE)).sample(4, seed=0)
    assert trace.trace_times_s is not None and max(trace.prompt_lens) <= 64
