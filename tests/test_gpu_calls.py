"""`benchmarks/gpu_calls.py`: which runner each stored GPU call measured, read from its
profile, so that no call's runs are priced with another runner's profile and none drop out
unseen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_calls  # noqa: E402


def test_every_call_with_runs_names_its_runner() -> None:
    for runs in sorted(gpu_calls.RESULTS.glob("*/real/*")):
        call, model = runs.parents[1].name, runs.name
        if list(runs.glob("*.json.xz")):
            assert gpu_calls.profile_of(call, model) is not None, runs
            assert gpu_calls.runner_of(call, model) is not None or call == "eager", runs


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b"])
def test_the_runners_split_the_calls(model: str) -> None:
    staged = gpu_calls.call_runs(model, gpu_calls.STAGED_RUNNER)
    rebuilt = gpu_calls.call_runs(model, gpu_calls.REBUILT_RUNNER)
    assert staged and rebuilt and not {c for c, _ in staged} & {c for c, _ in rebuilt}
    assert "staged_inputs" in {c for c, _ in staged}
    assert "eager" not in {c for c, _ in staged + rebuilt}


def test_a_callable_picks_runners_and_skip_drops_calls() -> None:
    every = {c for c, _ in gpu_calls.call_runs("llama-2-7b", lambda r: True, skip=())}
    assert {"eager", "two_at_once", "staged_inputs", "current_grid"} <= every
    graphs = {c for c, _ in gpu_calls.call_runs("llama-2-7b", lambda r: r is not None)}
    assert "eager" not in graphs and "two_at_once" not in graphs and "current_grid" in graphs
