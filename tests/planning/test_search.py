"""Bracketing and bisection over a monotone predicate."""

from __future__ import annotations

import pytest

from pagesim.errors import ConfigError
from pagesim.planning.search import search_max, search_min


@pytest.mark.parametrize("boundary, start", [(7.3, 1.0), (7.3, 50.0), (0.3, 4.0), (99.0, 99.0)])
def test_search_max_finds_boundary_within_tolerance(boundary: float, start: float) -> None:
    seen: list[float] = []

    def passes(x: float) -> bool:
        seen.append(x)
        return x <= boundary

    b = search_max(passes, start, 0.01, 1000.0, rel_tol=0.01)
    assert b.best <= boundary < b.failed
    assert b.failed - b.best <= 0.01 * b.failed
    assert len(seen) == len(set(seen)) == b.num_evaluations  # each value simulated once


def test_search_max_range_ends() -> None:
    assert search_max(lambda x: True, 1.0, 0.5, 8.0).best == 8.0
    assert search_max(lambda x: True, 1.0, 0.5, 8.0).failed is None
    b = search_max(lambda x: False, 1.0, 0.5, 8.0)
    assert b.best is None and b.failed == 0.5


def test_search_min_finds_boundary() -> None:
    b = search_min(lambda x: x >= 123.0, 1000.0, 10.0, 1000.0, rel_tol=0.01)
    assert b.failed < 123.0 <= b.best
    assert (b.best - b.failed) <= 0.011 * b.best
    assert search_min(lambda x: False, 1000.0, 10.0, 1000.0).best is None


def test_bad_ranges() -> None:
    with pytest.raises(ConfigError, match="floor"):
        search_max(lambda x: True, 0.1, 1.0, 2.0)
    with pytest.raises(ConfigError, match="rel_tol"):
        search_max(lambda x: True, 1.0, 1.0, 2.0, rel_tol=0.0)
