"""Bracketing and bisection over one monotone pass/fail check.

`search_max` finds the largest x that passes when passing is monotone downwards (a request
rate: lower is easier); `search_min` the smallest x that passes when it is monotone upwards
(KV memory: more is easier). Both bracket by doubling or halving from `start`, then bisect
until the passing and the failing value are within `rel_tol` of each other, as Vidur's
capacity search does. Every evaluated value goes through `passes` once (memoised), in a
deterministic order.

    passes:   T T T T T F F F        x ->
                      ^ best  ^ nearest failing value (`failed`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict, Unpack

from pagesim.errors import ConfigError


@dataclass(frozen=True)
class Boundary:
    """The search's answer: `best` passed (None: nothing in range passed), `failed` is the
    closest value that failed (None: everything up to the range's end passed)."""

    best: float | None
    failed: float | None
    num_evaluations: int


def search_max(
    passes: Callable[[float], bool],
    start: float,
    floor: float,
    ceiling: float,
    rel_tol: float = 0.025,
    max_evaluations: int = 40,
    step: float = 2.0,
) -> Boundary:
    """Largest x in [floor, ceiling] with passes(x), for passes monotone non-increasing.

    `step` is the bracketing factor: 2 from a rough start; smaller when `start` is known to be
    near the answer (a band's end, from the center's answer), so that fewer values are tried."""
    _check_range(floor, start, ceiling)
    if not 0 < rel_tol < 1:
        raise ConfigError(f"rel_tol={rel_tol!r}: must be in (0, 1)")
    if not step > 1:
        raise ConfigError(f"step={step!r}: must be > 1")
    memo: dict[float, bool] = {}

    def check(x: float) -> bool:
        if x not in memo:
            if len(memo) >= max_evaluations:
                raise ConfigError(f"search did not converge in {max_evaluations} evaluations")
            memo[x] = bool(passes(x))
        return memo[x]

    lo: float | None = None
    hi: float | None = None
    x = start
    if check(x):
        lo = x
        while hi is None and lo < ceiling:
            x = min(lo * step, ceiling)
            if check(x):
                lo = x
            else:
                hi = x
    else:
        hi = x
        while lo is None and hi > floor:
            x = max(hi / step, floor)
            if check(x):
                lo = x
            else:
                hi = x
    if lo is None or hi is None:
        return Boundary(lo, hi, len(memo))
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if check(mid):
            lo = mid
        else:
            hi = mid
    return Boundary(lo, hi, len(memo))


class Precision(TypedDict, total=False):
    """How finely a search brackets and bisects: `search_max`'s keywords, which `search_min`
    passes on as they are."""

    rel_tol: float
    max_evaluations: int
    step: float


def search_min(
    passes: Callable[[float], bool],
    start: float,
    floor: float,
    ceiling: float,
    **precision: Unpack[Precision],
) -> Boundary:
    """Smallest x in [floor, ceiling] with passes(x), for passes monotone non-decreasing.

    Runs `search_max` over y = 1/x (passing is then monotone non-increasing in y)."""
    _check_range(floor, start, ceiling)
    b = search_max(lambda y: passes(1.0 / y), 1.0 / start, 1.0 / ceiling, 1.0 / floor, **precision)
    return Boundary(_inverse(b.best), _inverse(b.failed), b.num_evaluations)


def _check_range(floor: float, start: float, ceiling: float) -> None:
    if not 0 < floor <= start <= ceiling:
        raise ConfigError(
            f"search range: need 0 < floor ({floor:g}) <= start ({start:g}) "
            f"<= ceiling ({ceiling:g})"
        )


def _inverse(y: float | None) -> float | None:
    return None if y is None else 1.0 / y
