"""The calls that served each Poisson run more than once (`results/validation/staged_passes*/`):
their reports' repeat groups are what `pagesim validate` makes of the stored runs, and the
READMEs' figures are the reports'."""

from __future__ import annotations

import json
from pathlib import Path

from pagesim.cli.app import main

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "validation"
GROUPS = (
    "chat-50pct-bs16",
    "chat-85pct-bs16",
    "chat-85pct-bs32",
    "chat-95pct-bs16",
    "code-85pct-bs16",
    "system-prompt-85pct-bs16",
)
#: (call, model, report stem, profile column) of every row of the README's repeats table
REPORTS = [
    ("staged_passes", "llama-2-7b", "validation_llama-2-7b", "shipped"),
    ("staged_passes", "llama-3-8b", "validation_llama-3-8b", "shipped"),
    ("staged_passes2", "llama-3-8b", "validation_llama-3-8b", "shipped"),
    ("staged_passes2", "llama-3-8b", "validation_llama-3-8b_own_profile", "own"),
]


def _report(call: str, stem: str) -> dict:
    return json.loads((RESULTS / call / f"{stem}.json").read_text())


def _table_row(call: str, model: str, stem: str, profile: str) -> str:
    doc = _report(call, stem)
    groups = {g["run"]: {r["metric"]: r for r in g["rows"]} for g in doc["repeat_groups"]}
    cells = []
    for name in GROUPS:
        r = groups[name]["mean_tpot_ms"]
        cells.append(f"{r['error_pct']:+.1f}{'' if r['met'] else '*'} ({r['real_spread_pct']:.1f})")
    return (
        f"| `{call}/` | {model} | {profile} | {doc['num_runs']} | {doc['targets_met']} of "
        f"{doc['targets_checked']} | {doc['repeat_targets_met']} of "
        f"{doc['repeat_targets_checked']} | " + " | ".join(cells) + " |"
    )


def test_the_repeats_table_is_the_stored_reports() -> None:
    text = (RESULTS / "README.md").read_text()
    table = [
        line
        for line in text.splitlines()
        if line.startswith("| `staged_passes") and " | llama-" in line
    ]
    assert table == [_table_row(*r) for r in REPORTS]


def test_the_readme_states_the_reports_counts() -> None:
    docs = [_report(call, stem) for call, _, stem, profile in REPORTS if profile == "shipped"]
    text = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"meet {docs[0]['repeat_targets_met']} of 84 targets (llama-2-7b) and "
        f"{docs[1]['repeat_targets_met']} of 84 in each of the two llama-3-8b calls"
    ) in text
    assert docs[1]["repeat_targets_met"] == docs[2]["repeat_targets_met"]
    rows = {
        line.split(" | ")[0][2:]: line
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(("| llama-2-7b | chat at", "| llama-3-8b | the same |"))
    }
    assert (
        f"; {docs[0]['repeat_targets_met']} of 84 against the mean of repeated runs"
        in rows["llama-2-7b"]
    )
    assert (
        f"; {docs[1]['repeat_targets_met']} and {docs[2]['repeat_targets_met']} of 84 "
        "against the mean of repeated runs in two calls" in rows["llama-3-8b"]
    )
    assert (
        "run by run, "
        + ", ".join(f"{d['targets_met']} of {d['targets_checked']}" for d in docs[:2])
        + f" and {docs[2]['targets_met']} of "
        f"{docs[2]['targets_checked']}"
    ) in text


def test_a_stored_repeat_group_is_what_validate_makes_of_its_runs(tmp_path) -> None:
    """code at 85 % for llama-2-7b, served three times: one simulation, the mean and spread."""
    real = RESULTS / "staged_passes" / "real" / "llama-2-7b"
    runs = [real / f"code-85pct-bs16{s}.json.xz" for s in ("", "-r2", "-r3")]
    argv = [
        "validate",
        "--profile",
        str(ROOT / "calibration" / "h200" / "llama-2-7b"),
        "--output-dir",
        str(tmp_path),
        "--name",
        "v",
    ]
    for r in runs:
        argv += ["--real", str(r)]
    assert main(argv) == 0
    got = json.loads((tmp_path / "v.json").read_text())["repeat_groups"]
    stored = next(
        g
        for g in _report("staged_passes", "validation_llama-2-7b")["repeat_groups"]
        if g["run"] == "code-85pct-bs16"
    )
    assert len(got) == 1 and sorted(got[0]["runs"]) == sorted(stored["runs"])
    key = ("metric", "error_pct", "real_spread_pct", "met", "runs_met")
    assert [{k: r[k] for k in key} for r in got[0]["rows"]] == [
        {k: r[k] for k in key} for r in stored["rows"]
    ]
