"""The calibrated model's corrections: what interpolating the measured grid alone gets wrong.

Each is named and one small module, fitted in the order of `CORRECTIONS` (each on the model the
ones before it leave) and can be switched off (`CalibratedCostModel(disabled_corrections=...)`,
`--disable-correction NAME` on `pagesim run`, `pagesim plan` and `pagesim fit-report`, which
also prints what each is worth on the profile's held-out steps; docs/cost_model.md has that
table for the shipped profiles).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pagesim.errors import ConfigError

#: The corrections, in the order they are fitted; each is the module of its name.
CORRECTIONS = ("drift", "multi_part", "varlen", "spread", "reread", "prefill_bias")


def enabled_corrections(disabled: Iterable[str] = ()) -> frozenset[str]:
    """The corrections left on once `disabled` are off; a ConfigError for an unknown name."""
    off = set(disabled)
    unknown = sorted(off - set(CORRECTIONS))
    if unknown:
        raise ConfigError(f"correction {unknown[0]!r} is unknown (known: {', '.join(CORRECTIONS)})")
    return frozenset(CORRECTIONS) - off


def by_block_size(rows, fitted: dict) -> list[tuple[int, list]]:
    """`rows` grouped by block size, ascending, for the block sizes `fitted` has (the rows a
    correction fits on, at the block sizes the grid has surfaces for)."""
    by_bs: dict[int, list] = defaultdict(list)
    for r in rows:
        if r.block_size in fitted:
            by_bs[r.block_size].append(r)
    return sorted(by_bs.items())
