"""`benchmarks/sensitivity.py`: a step-time error's amplification into metric errors, and the
stored tables are what its report makes of its stored rows."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import sensitivity  # noqa: E402
from gpu_calls import PARTIAL, RESULTS, SHIPPED, SKIP, call_runs, shipped_runner  # noqa: E402

from pagesim.validate import real_run_files  # noqa: E402


def test_a_rate_inf_run_moves_one_for_one_with_its_steps() -> None:
    """All requests arrive at once, so the schedule does not depend on the steps' times: every
    latency scales with them exactly, and throughput inversely."""
    run = RESULTS / "staged_inputs6" / "real" / "llama-2-7b" / "chat-inf-bs16.json.xz"
    rows = {
        r["metric"]: r
        for r in sensitivity.run_rows(("staged_inputs6", run, SHIPPED / "llama-2-7b", 0.02))
    }
    assert set(rows) == set(sensitivity.METRICS)
    for m in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "p99_tpot_ms"):
        assert rows[m]["amplification"] == pytest.approx(1.0, abs=2e-3)
    assert rows["request_throughput"]["amplification"] == pytest.approx(-1.0, abs=2e-3)
    r = rows["mean_tpot_ms"]
    assert r["residual_pct"] == pytest.approx(
        r["error_pct"] - r["amplification"] * r["step_error_pct"], abs=2e-3
    )


def test_a_loaded_run_amplifies_the_step_time() -> None:
    """At 85 % load a slower step also grows the batches and the queue."""
    run = RESULTS / "staged_inputs6" / "real" / "llama-2-7b" / "code-85pct-bs16.json.xz"
    rows = {
        r["metric"]: r
        for r in sensitivity.run_rows(("staged_inputs6", run, SHIPPED / "llama-2-7b", 0.02))
    }
    assert rows["mean_tpot_ms"]["amplification"] > 1.5


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b"])
def test_stored_tables_cover_every_run_and_are_their_report(model: str) -> None:
    stem = RESULTS / f"sensitivity_{model}"
    with open(f"{stem}.csv", newline="", encoding="utf-8") as fh:
        rows = [
            {k: v if k in ("call", "run", "metric") else float(v) for k, v in r.items()}
            for r in csv.DictReader(fh)
        ]
    calls = call_runs(model, shipped_runner(model), skip=SKIP - PARTIAL)
    stored = {(call, f.name.split(".")[0]) for call, d in calls for f in real_run_files(d)}
    assert {(r["call"], r["run"]) for r in rows} == stored
    text = sensitivity.markdown(
        model, Path("calibration/h200") / model, 0.02, rows, [c for c, _ in calls]
    )
    assert Path(f"{stem}.md").read_text(encoding="utf-8") == text
