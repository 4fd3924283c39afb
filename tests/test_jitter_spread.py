"""`benchmarks/jitter_spread.py`: per-step noise in the simulator against the spread of
repeated real runs, and the stored tables are what its report makes of its stored rows."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import jitter_spread  # noqa: E402

from pagesim.cost.base import BatchShape  # noqa: E402
from pagesim.cost.scaled import ScaledCostModel  # noqa: E402


class _Flat:
    def step_time(self, batch: BatchShape) -> float:
        return 0.01


def _times(sigma: float, seed: int, n: int = 200) -> list[float]:
    model = jitter_spread.JitteredCostModel(_Flat(), sigma, seed)
    batch = BatchShape.decode(1, 100)
    return [model.step_time(batch) for _ in range(n)]


def test_jitter_scatters_steps_by_sigma_and_repeats_with_its_seed() -> None:
    assert _times(0.0, 1) == [0.01] * 200
    a, b = _times(0.02, 1, 4000), _times(0.02, 2, 4000)
    assert a == _times(0.02, 1, 4000) and a != b
    mean = sum(a) / len(a)
    std = (sum((t - mean) ** 2 for t in a) / len(a)) ** 0.5
    assert abs(mean / 0.01 - 1) < 0.002 and abs(std / 0.01 - 0.02) < 0.002


def test_jitter_keeps_the_base_models_shared_prefix_cost() -> None:
    class Reread(_Flat):
        reread_fraction = {16: 0.6}

    assert jitter_spread.JitteredCostModel(Reread(), 0.01, 0).reread_fraction == {16: 0.6}
    assert ScaledCostModel(Reread(), 1.0).reread_fraction == {16: 0.6}


def test_stored_tables_cover_every_group_and_are_their_report() -> None:
    stem = ROOT / "results" / "validation" / "jitter_spread"
    with open(f"{stem}.csv", newline="", encoding="utf-8") as fh:
        rows = [
            {k: v if k in ("call", "model", "run", "metric") else float(v) for k, v in r.items()}
            for r in csv.DictReader(fh)
        ]
    for r in rows:
        r["runs"], r["replicas"] = int(r["runs"]), int(r["replicas"])
    assert {(r["call"], r["model"], r["run"]) for r in rows} == {
        (call, model, run) for call, model, run, _ in jitter_spread.groups()
    }
    text = jitter_spread.markdown(rows, int(rows[0]["replicas"]))
    assert Path(f"{stem}.md").read_text(encoding="utf-8") == text
