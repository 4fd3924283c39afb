"""The validation report: markdown tables of the errors, and the files `pagesim validate`
writes (`<name>.json`, `<name>.md`, `<name>.png`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pagesim.validate.compare import SUMMARY_METRICS, TARGETS_PCT, repeat_groups
from pagesim.validate.plot import plot_errors
from pagesim.validate.store import round_floats

#: Decimals of the floats in a validation report (`report_json`).
REPORT_DECIMALS = 6
RUNS_HEADING = (
    "Per run: error % of the prediction, (predicted - real) / real; * marks a missed target "
    "(throughput, mean TPOT and mean E2E 3 %, mean TTFT 5 %, the others 10 %)"
)
REPEATS_HEADING = (
    "Repeated runs: error % against the mean of the real runs "
    "(in brackets: their spread, max - min in % of the mean)"
)
REPEATS_MET_HEADING = (
    "Targets met against the repeats' mean (throughput, mean TPOT and mean E2E within "
    "max(3 %, half the repeats' spread); mean TTFT 5 %; P99 10 %)"
)


def report_markdown(entries: list[dict[str, Any]]) -> str:
    """One row per run: the error in % of each summary metric (`*` marks a missed target)."""
    return _error_table(entries, "prompts", lambda e: str(e["load"]["num_prompts"]), _error_cell)


def _error_cell(row: dict[str, Any]) -> str:
    return f"{row['error_pct']:+.1f}{'' if row['met'] else '*'}"


def _error_table(
    items: list[dict[str, Any]],
    count_head: str,
    count: Callable[[dict[str, Any]], str],
    cell: Callable[[dict[str, Any]], str],
) -> str:
    """A markdown table, one row per run (or group of runs): its name, model, block size,
    rate and `count`, then `cell` of each summary metric's comparison row."""
    head = ["run", "model", "bs", "rate", count_head] + [
        m.replace("_ms", "") for m in SUMMARY_METRICS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for item in items:
        by = {r["metric"]: r for r in item["rows"]}
        cells = [
            item["run"],
            item["model"],
            str(item["block_size"]),
            str(item["load"]["request_rate"]),
            count(item),
        ]
        cells += ["n/a" if by.get(m) is None else cell(by[m]) for m in SUMMARY_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repeats_met_markdown(groups: list[dict[str, Any]]) -> str:
    """Which targets each repeated load met against its real runs' mean, and the total."""
    lines = ["| run | runs | met | missed (error %, target %) |", "| --- | --- | --- | --- |"]
    met = checked = 0
    for g in groups:
        missed = [r for r in g["rows"] if not r["met"]]
        met += len(g["rows"]) - len(missed)
        checked += len(g["rows"])
        cells = ", ".join(
            f"{r['metric'].replace('_ms', '')} {r['error_pct']:+.1f} ({r['target_pct']:.1f})"
            for r in missed
        )
        lines.append(
            f"| {g['run']} | {len(g['runs'])} | {len(g['rows']) - len(missed)}/{len(g['rows'])}"
            f" | {cells or '-'} |"
        )
    lines.append(f"| all | | {met}/{checked} | |")
    return "\n".join(lines)


def repeats_markdown(groups: list[dict[str, Any]]) -> str:
    """One row per repeated run: the error in % of each summary metric against the real runs'
    mean (`*` marks a missed target), and in brackets the real runs' spread in %."""
    return _error_table(
        groups,
        "runs",
        lambda g: str(len(g["runs"])),
        lambda r: f"{_error_cell(r)} ({r['real_spread_pct']:.1f})",
    )


def report_tables(entries: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None) -> str:
    """The report's text: what priced the runs (each cost model once), the table of runs,
    then the repeats' table when there are repeats (`groups`: `repeat_groups(entries)`, made
    here when not given)."""
    groups = repeat_groups(entries) if groups is None else groups
    priced = dict.fromkeys(e["cost_model"] for e in entries if "cost_model" in e)
    rows = [r for e in entries for r in e["rows"] if r["metric"] in SUMMARY_METRICS]
    met = sum(bool(r["met"]) for r in rows)
    text = "".join(f"{line}\n\n" for line in priced) + f"{RUNS_HEADING}\n\n"
    text += report_markdown(entries) + f"\n\nTargets met per run: {met} of {len(rows)}\n"
    if groups:
        text += f"\n{REPEATS_HEADING}\n\n{repeats_markdown(groups)}\n"
        text += f"\n{REPEATS_MET_HEADING}\n\n{repeats_met_markdown(groups)}\n"
    return text


def write_report(
    entries: list[dict[str, Any]],
    out_dir: str | Path,
    name: str = "validation",
    skipped: tuple[str, ...] = (),
) -> dict[str, Path]:
    """`<name>.json` (every entry, real and predicted results), `<name>.md` and `<name>.png`;
    `skipped` (why a run was not compared) goes into both texts, so the report says what it
    left out, and so does each entry's `runner_note` (a profile of another runner mode)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json", "md": out / f"{name}.md", "png": out / f"{name}.png"}
    met = [r["met"] for e in entries for r in e["rows"]]
    doc = {
        "targets_pct": TARGETS_PCT,
        "num_runs": len(entries),
        "targets_met": sum(met),
        "targets_checked": len(met),
        "runs": entries,
    }
    groups = repeat_groups(entries)
    text = report_tables(entries, groups)
    if groups:
        group_met = [r["met"] for g in groups for r in g["rows"]]
        doc.update(
            repeat_groups=groups,
            repeat_targets_met=sum(group_met),
            repeat_targets_checked=len(group_met),
        )
    if skipped:
        doc["skipped"] = list(skipped)
    paths["json"].write_text(report_json(doc), encoding="utf-8")
    notes = "".join(f"\nskipped: {note}\n" for note in skipped) + "".join(
        f"\nwarning: {e['run']}: {e['runner_note']}\n" for e in entries if "runner_note" in e
    )
    paths["md"].write_text(text + notes, encoding="utf-8")
    plot_errors(entries, paths["png"])
    return paths


def report_json(doc: dict[str, Any]) -> str:
    """A report as stored: compact, keys sorted, floats to `REPORT_DECIMALS` (1 ns on a value in
    ms, far below a run's own spread), so that hundreds of reports stay small."""
    return (
        json.dumps(round_floats(doc, REPORT_DECIMALS), separators=(",", ":"), sort_keys=True) + "\n"
    )
