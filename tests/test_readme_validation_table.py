"""The validation tables in README.md and results/validation/README.md are the shipped report's
figures: every row must match `results/validation/validation_<model>.json` (re-made by
`pagesim validate`), so a re-made report with a stale README fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pagesim.cost.profile import Profile
from pagesim.cost.profile_merge import merge_profiles

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_calls import call_profiles, shipped_runner  # noqa: E402

COLUMNS = (
    "request_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
)
MODELS = ("llama-2-7b", "llama-3-8b")


def report_rows(model: str) -> list[str]:
    """The README row of every run of the shipped report: error % per column, `*` = missed."""
    doc = json.loads((ROOT / "results" / "validation" / f"validation_{model}.json").read_text())
    rows = []
    for run in doc["runs"]:
        by = {r["metric"]: r for r in run["rows"]}
        cells = [f"{by[c]['error_pct']:+.1f}" + ("" if by[c]["met"] else "*") for c in COLUMNS]
        met = sum(r["met"] for r in run["rows"])
        rows.append(
            f"| {model} | {run['run']} | " + " | ".join(cells) + f" | {met}/{len(run['rows'])} |"
        )
    return rows


@pytest.mark.parametrize("readme", ["README.md", "results/validation/README.md"])
@pytest.mark.parametrize("model", MODELS)
def test_readme_table_is_the_shipped_report(readme: str, model: str) -> None:
    text = (ROOT / readme).read_text()
    table = [
        line
        for line in text.splitlines()
        if line.startswith(f"| {model} | ") and line.count("|") == 11
    ]
    assert sorted(table) == sorted(report_rows(model))


def test_readme_states_the_shipped_counts() -> None:
    docs = [
        json.loads((ROOT / "results" / "validation" / f"validation_{m}.json").read_text())
        for m in MODELS
    ]
    assert [d["targets_checked"] for d in docs] == [140, 140]
    text = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"{docs[0]['targets_met']} of 140 met for llama-2-7b and {docs[1]['targets_met']}"
        " of 140 for llama-3-8b"
    ) in text


# README's table of shipped profiles: the reports whose targets a row's count sums, for the
# models not in MODELS
SHIPPED_REPORTS = {
    "llama-2-13b": ["capture_sizes/validation_llama-2-13b.json"],
    "qwen2.5-7b": [
        "validation_qwen2.5-7b.json",
        "validation_qwen2.5-7b_runs_of_staged_inputs4.json",
        "validation_qwen2.5-7b_runs_of_staged_inputs5.json",
        "validation_qwen2.5-7b_runs_of_staged_inputs6.json",
    ],
}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("model", sorted(SHIPPED_REPORTS))
def test_shipped_profile_rows_are_their_reports(model: str) -> None:
    """The count in the shipped-profiles table is the reports' sum, and the reports priced
    the runs with the very profile that is shipped (byte for byte)."""
    docs = [
        json.loads((ROOT / "results" / "validation" / f).read_text())
        for f in SHIPPED_REPORTS[model]
    ]
    for doc in docs:
        for run in doc["runs"]:
            assert _files(ROOT / run["profile"]) == _files(ROOT / "calibration" / "h200" / model)
    met = sum(d["targets_met"] for d in docs)
    checked = sum(d["targets_checked"] for d in docs)
    rows = [
        line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(f"| {model} | ")
    ]
    assert len(rows) == 1 and rows[0].endswith(f"| {met} of {checked} |"), rows


# The calls whose calibrations the shipped profile is the median of (`pagesim merge-profiles`),
# and the call whose runs the top-level reports compare: the newest
SHIPPED_SOURCES = {
    "llama-2-7b": (
        "staged_inputs",
        "staged_inputs3",
        "staged_inputs4",
        "staged_inputs5",
        "staged_inputs6",
        "staged_inputs7",
        "staged_inputs_calib",
        "staged_inputs_calib2",
    ),
    "llama-3-8b": (
        "staged_inputs",
        "staged_inputs2",
        "staged_inputs3",
        "staged_inputs5",
        "staged_inputs6",
        "staged_inputs7",
        "staged_inputs_calib2",
    ),
    "qwen2.5-7b": (
        "staged_inputs4",
        "staged_inputs5",
        "staged_inputs6",
        "staged_inputs7",
        "staged_inputs_calib3",
    ),
}
SHIPPED_CALL = "staged_inputs7"


@pytest.mark.parametrize("model", sorted(SHIPPED_SOURCES))
def test_the_shipped_profile_is_the_median_of_its_calls_calibrations(model: str, tmp_path) -> None:
    """Byte for byte what `pagesim merge-profiles` makes of the listed calls' profiles, and
    those are every calibration of the shipped profile's runner: none left out."""
    sources = [
        Profile.load(ROOT / "results" / "validation" / call / "profile" / "h200" / model)
        for call in SHIPPED_SOURCES[model]
    ]
    merged = merge_profiles(sources).save(tmp_path / model)
    assert _files(merged) == _files(ROOT / "calibration" / "h200" / model)
    runner = shipped_runner(model)
    assert sorted(call_profiles(model, runner)) == sorted(SHIPPED_SOURCES[model])


@pytest.mark.parametrize("model", MODELS)
def test_the_shipped_report_is_the_newest_calls_runs(model: str) -> None:
    """The top-level report prices every run of the newest call with the shipped profile."""
    call = ROOT / "results" / "validation" / SHIPPED_CALL
    doc = json.loads((ROOT / "results" / "validation" / f"validation_{model}.json").read_text())
    runs = sorted(p.name.split(".")[0] for p in (call / "real" / model).glob("*.json.xz"))
    assert sorted(r["run"] for r in doc["runs"]) == runs
    for run in doc["runs"]:
        assert Path(run["profile"]) == Path("calibration") / "h200" / model
