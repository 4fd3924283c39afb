"""The simulator's lazy views of a step's decode contexts answer the cost model's `longest()`
exactly as the list they stand for would."""

from __future__ import annotations

from pagesim.cost.base import longest_context
from pagesim.sim.bulk.decodes import _Contexts
from pagesim.sim.runner import _Joined


def test_lazy_contexts_know_their_longest() -> None:
    offsets = [120, 900, 45, 300]
    for n in range(len(offsets) + 1):
        view = _Contexts(offsets, n, 7)
        assert longest_context(view) == max(list(view), default=0)


def test_joined_views_know_their_longest() -> None:
    lead = _Contexts([10, 400], 2, 3)
    for tail in ([], [5], [1000, 2]):
        joined = _Joined(lead, tail)
        assert longest_context(joined) == max(list(joined))


def test_the_bulk_decodes_kept_maximum_is_the_views_longest() -> None:
    view = _Contexts([120, 900, 45], 3, 7, offset_max=900)
    assert longest_context(view) == 907 == max(view)
