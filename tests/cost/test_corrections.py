"""The calibrated model's corrections: named, ordered, each one switched off on its own, and
each one off changes the price of the steps it is about (and only the model's own fits)."""

from __future__ import annotations

import pytest

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.corrections import CORRECTIONS
from pagesim.cost.fit import contributions_markdown, correction_contributions, fit_report
from pagesim.cost.profile import Profile
from pagesim.data import calibration_dir
from pagesim.errors import ConfigError

SPREAD = [100, 400, 900, 2500, 3100, 50, 700, 1800]  # one decode step of unequal contexts


@pytest.fixture(scope="module")
def shipped() -> Profile:
    return Profile.load(calibration_dir() / "h200" / "llama-2-7b")


# the step each correction is about -> the corrections that must change its price
STEPS = {
    "decode": (BatchShape.decode(24, 1500, 16), {"drift"}),
    "spread decode": (
        BatchShape(16, len(SPREAD), len(SPREAD), sum(SPREAD), SPREAD),
        {"drift", "spread"},
    ),
    "shared decode": (
        BatchShape(16, 8, 8, sum(SPREAD), SPREAD, shared_context_tokens=8 * 48),
        {"drift", "spread", "reread"},
    ),
    "long prefill": (BatchShape.prefill(6000, 0, 16), {"drift", "varlen", "prefill_bias"}),
    "mixed": (BatchShape.mixed(256, 512, 40, 900, 16), {"drift", "varlen"}),
}


def test_each_correction_off_changes_only_the_steps_it_is_about(shipped) -> None:
    on = CalibratedCostModel(shipped)
    assert on.corrections == CORRECTIONS
    for name in CORRECTIONS:
        off = CalibratedCostModel(shipped, disabled_corrections=[name])
        assert off.corrections == tuple(c for c in CORRECTIONS if c != name)
        for step, (shape, moved_by) in STEPS.items():
            changed = off.step_time(shape) != on.step_time(shape)
            assert changed == (name in moved_by), (name, step)


def test_multi_part_prices_the_parts_when_varlen_is_off(shipped) -> None:
    base = CalibratedCostModel(shipped, disabled_corrections=["varlen"])
    off = CalibratedCostModel(shipped, disabled_corrections=["varlen", "multi_part"])
    assert (
        base.fits["multi_part"][False] > 0.0
        and off.fits["multi_part"][False] == off.fits["multi_part"][True] == 0.0
    )
    shape = STEPS["mixed"][0]
    graph = base.padded_tokens(shape.total_tokens) is not None
    shared = base.fits["multi_part"][True] if graph else base.fits["multi_part"][False]
    assert off.step_time(shape) - base.step_time(shape) == pytest.approx(shared)


def test_unknown_names_are_one_line_errors(shipped) -> None:
    with pytest.raises(ConfigError, match="correction 'nope' is unknown .*drift, multi_part"):
        CalibratedCostModel(shipped, disabled_corrections=["nope"])


def test_contributions_are_fit_reports_on_one_held_out_draw(shipped) -> None:
    reports = correction_contributions(shipped, seed=1)
    assert list(reports) == [None, *CORRECTIONS]
    assert reports[None] == fit_report(shipped, seed=1)
    assert reports["varlen"] == fit_report(shipped, seed=1, disabled_corrections=("varlen",))
    assert {r.num_holdout for r in reports["varlen"].rows} == {
        r.num_holdout for r in reports[None].rows
    }
    table = contributions_markdown(reports)
    assert table.count("\n") == len(CORRECTIONS) + 2 and "| without reread |" in table
