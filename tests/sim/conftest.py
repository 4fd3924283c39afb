"""Fixtures for the simulator tests."""

from __future__ import annotations

import pytest

import pagesim.sim.simulate as simulate_module
from pagesim.scheduler.scheduler import Scheduler


@pytest.fixture
def built_schedulers(monkeypatch: pytest.MonkeyPatch) -> list[Scheduler]:
    """Every scheduler `simulate()` builds during the test, to inspect its KV cache afterwards."""
    built: list[Scheduler] = []
    original = simulate_module.build_scheduler

    def capture(config, check_invariants: bool = False) -> Scheduler:
        scheduler = original(config, check_invariants)
        built.append(scheduler)
        return scheduler

    monkeypatch.setattr(simulate_module, "build_scheduler", capture)
    return built
