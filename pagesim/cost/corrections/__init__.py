"""The calibrated model's corrections: what interpolating the measured grid alone gets wrong.

`CalibratedCostModel` is interpolation over the profile's measured rows plus these, each one
named, each one small module, fitted in the order of `CORRECTIONS` (each on the model that the
ones before it leave) and each able to be switched off
(`CalibratedCostModel(..., disabled_corrections=("spread",))`, `pagesim fit-report
--disable-correction spread`). `pagesim fit-report` prints what each is worth on the
profile's held-out steps; docs/cost_model.md holds that table for the shipped profiles.
"""

from __future__ import annotations

from collections.abc import Iterable

from pagesim.errors import ConfigError

#: The corrections, in the order they are fitted.
CORRECTIONS: tuple[str, ...] = (
    "drift",  # each block size's section drift in the non-attention time (drift.py)
    "multi_part",  # the launch cost a step of several parts pays once (multi_part.py)
    "varlen",  # steps with prefill entries priced from the kernel's programs (varlen.py)
    "spread",  # decode contexts of unequal length (spread.py)
    "reread",  # reads of cached prefix blocks that several sequences share (reread.py)
    "prefill_bias",  # what the varlen fit leaves on one long eager prefill (prefill_bias.py)
)


def enabled_corrections(disabled: Iterable[str] = ()) -> frozenset[str]:
    """The corrections left on once `disabled` are off; a ConfigError for an unknown name."""
    off = set(disabled)
    unknown = sorted(off - set(CORRECTIONS))
    if unknown:
        raise ConfigError(f"correction {unknown[0]!r} is unknown (known: {', '.join(CORRECTIONS)})")
    return frozenset(CORRECTIONS) - off
