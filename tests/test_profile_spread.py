"""`benchmarks/profile_spread.py`: each call's decode rows against the median of its runner's
profiles, on the shapes they all have; and the stored tables are what the profiles give."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import profile_spread  # noqa: E402

from tests.cost.synthetic_profile import make_synthetic_profile  # noqa: E402


def test_each_profile_is_compared_with_the_median_of_all_on_shared_shapes() -> None:
    tables = {
        "a": {(1, 128): 10.0, (1, 512): 10.0, (8, 128): 20.0, (64, 128): 1.0},
        "b": {(1, 128): 11.0, (1, 512): 12.0, (8, 128): 20.0},
        "c": {(1, 128): 9.0, (1, 512): 10.0, (8, 128): 22.0},
    }
    result = profile_spread.spread(tables)
    # batch 1: medians 10 and 10 -> a 0 and 0, b +10 and +20 (median +15), c -10 and 0
    assert result["a"] == {1: pytest.approx(0.0), 8: pytest.approx(0.0)}
    assert result["b"] == {1: pytest.approx(15.0), 8: pytest.approx(0.0)}
    assert result["c"] == {1: pytest.approx(-5.0), 8: pytest.approx(10.0)}  # (64, 128): a only
    text = profile_spread.report("m", 16, result)
    assert "| c | -5.0 | +10.0 | -5.0 to +10.0 |" in text


def test_decode_rows_read_one_block_size(tmp_path) -> None:
    profile = make_synthetic_profile()
    rows = profile_spread.decode_rows(profile.save(tmp_path / "p"), 16)
    assert rows == {
        (r.batch_size, r.context_len): r.step_time_ms for r in profile.decode if r.block_size == 16
    }
    assert rows and len(rows) < len(profile.decode)


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b"])
def test_stored_tables_are_the_profiles(model: str) -> None:
    profiles = profile_spread.call_profiles(model, profile_spread.shipped_runner(model))
    tables = {n: profile_spread.decode_rows(p, 16) for n, p in profiles.items()}
    text = profile_spread.report(model, 16, profile_spread.spread(tables))
    stored = ROOT / "results" / "validation" / f"profile_spread_{model}.md"
    assert stored.read_text() == text
