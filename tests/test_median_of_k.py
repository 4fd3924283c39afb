"""`benchmarks/median_of_k.py`: every subset of the other calls' calibrations is scored on
each held-out call, and the stored tables are what its report makes of its stored rows."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import median_of_k  # noqa: E402
from gpu_calls import shipped_runner  # noqa: E402


def test_report_takes_mean_worst_and_best_per_k() -> None:
    rows = [
        {"call": "a", "k": 1, "subset": "b", "met": 7, "targets": 14},
        {"call": "b", "k": 1, "subset": "a", "met": 14, "targets": 14},
        {"call": "a", "k": 2, "subset": "b c", "met": 13, "targets": 14},
    ]
    text = median_of_k.report("m", rows)
    assert "| 1 | 2 | 75.0 | 50.0 | 100.0 |" in text
    assert "| 2 | 1 | 92.9 | 92.9 | 92.9 |" in text
    assert "(2 held-out calls)" in text


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b"])
def test_stored_tables_cover_every_subset_and_are_their_report(model: str) -> None:
    stem = ROOT / "results" / "validation" / f"median_of_k_{model}"
    with open(f"{stem}.csv", newline="", encoding="utf-8") as fh:
        rows = [
            {**r, "k": int(r["k"]), "met": int(r["met"]), "targets": int(r["targets"])}
            for r in csv.DictReader(fh)
        ]
    cases = median_of_k.subsets(model, shipped_runner(model))
    assert sorted((r["call"], r["subset"]) for r in rows) == sorted(
        (call, " ".join(subset)) for call, subset in cases
    )
    assert all(r["call"] not in r["subset"].split() for r in rows)
    assert Path(f"{stem}.md").read_text(encoding="utf-8") == median_of_k.report(model, rows)
