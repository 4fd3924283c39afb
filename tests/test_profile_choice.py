"""`benchmarks/profile_choice.py`: the shipped profile's choice, checked leave one call out.

The rule is only honest if a held-out call's own profile never scores it, also where the
shipped profile is a copy of that call's; and the figures in results/validation/README.md
are the stored reports'."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import profile_choice  # noqa: E402


def _profile(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "profile.json").write_text(text)
    return folder


def test_leave_one_out_never_scores_a_call_with_its_own_profile(tmp_path) -> None:
    profiles = {
        "shipped": _profile(tmp_path / "shipped", "a"),
        "a": _profile(tmp_path / "a", "a"),  # the shipped profile is a's copy
        "b": _profile(tmp_path / "b", "b"),
    }
    assert profile_choice.made_by(profiles, "a") == {"a", "shipped"}
    assert profile_choice.made_by(profiles, "b") == {"b"}
    # Each profile is best on its own call's runs and poor on the other's.
    met = {"shipped": {"a": 14, "b": 2}, "a": {"a": 14, "b": 2}, "b": {"a": 3, "b": 14}}
    text = profile_choice.report("m", met, {"a": 14, "b": 14}, profiles)
    assert "| a | b | 3/14 | 14/14 | 14/14 |" in text
    # "shipped" is a's copy: it is never chosen for a held-out call, not even b
    assert "| b | a | 2/14 | 14/14 | 2/14 |" in text
    assert "Leave-one-call-out total: 5 of 28; each call's own profile: 28 of 28" in text


def test_the_median_of_the_other_calls_is_scored_beside_the_chosen_profile(tmp_path) -> None:
    profiles = {
        "a": _profile(tmp_path / "a", "a"),
        "b": _profile(tmp_path / "b", "b"),
        "c": _profile(tmp_path / "c", "c"),
    }
    met = {
        "a": {"a": 14, "b": 2, "c": 9},
        "b": {"a": 3, "b": 14, "c": 10},
        "c": {"a": 5, "b": 6, "c": 14},
        profile_choice.MEDIAN: {"a": 14, "b": 14, "c": 14},
    }
    text = profile_choice.report(
        "m", met, {"a": 14, "b": 14, "c": 14}, profiles, {"a": 12, "b": 11, "c": 13}
    )
    # the median of every call has seen the held-out call: it is never the chosen profile
    assert "| a | b | 3/14 | 12/14 | 14/14 |" in text
    assert "| b | a | 2/14 | 11/14 | 14/14 |" in text
    assert "| c | b | 10/14 | 13/14 | 14/14 |" in text
    assert (
        "Leave-one-call-out total: 15 of 42 (the median of the other calls' profiles: 36 "
        "of 42); each call's own profile: 42 of 42."
    ) in text


def test_a_changed_file_is_another_profile(tmp_path) -> None:
    a = _profile(tmp_path / "a", "x")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert profile_choice.same_profile(a, b)
    (b / "decode.csv").write_text("block_size\n")
    assert not profile_choice.same_profile(a, b)


@pytest.mark.parametrize(
    "model", ["llama-2-7b", "llama-3-8b", "qwen2.5-7b", "llama-2-13b", "opt-13b"]
)
def test_readme_table_is_the_stored_choice_reports(model: str) -> None:
    report = (ROOT / "results" / "validation" / f"profile_choice_{model}.md").read_text()
    loo, median_loo, own, shipped, total = map(
        int,
        re.search(
            r"Leave-one-call-out total: (\d+) of \d+ \(the median of the other calls' profiles: "
            r"(\d+) of \d+\); each call's own profile: (\d+) of \d+; "
            r"the shipped profile: (\d+) of (\d+)",
            report,
        ).groups(),
    )
    row = next(
        line
        for line in (ROOT / "results" / "validation" / "README.md").read_text().splitlines()
        if line.startswith(f"| {model} | ") and "leave" not in line and line.count("|") == 9
    )
    cells = [c.strip().replace(",", "") for c in row.strip("|").split("|")]
    assert int(cells[2]) == total and int(cells[3]) == shipped
    assert cells[5].startswith(f"{loo} (") and cells[6].startswith(f"{median_loo} (")
    assert cells[7].startswith(f"{own} (")


def test_without_a_shipped_profile_of_the_runner_the_report_has_no_shipped_column(tmp_path) -> None:
    profiles = {"a": _profile(tmp_path / "a", "a"), "b": _profile(tmp_path / "b", "b")}
    assert profile_choice.made_by(profiles, "a") == {"a"}
    met = {"a": {"a": 14, "b": 2}, "b": {"a": 3, "b": 14}}
    text = profile_choice.report("m", met, {"a": 14, "b": 14}, profiles)
    assert "| a | b | 3/14 | 14/14 |\n" in text and "shipped" not in text
    assert text.rstrip().endswith(
        "Leave-one-call-out total: 5 of 28; each call's own profile: 28 of 28."
    )
