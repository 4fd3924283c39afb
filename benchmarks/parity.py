"""Parity of pagesim's scheduler and KV cache with vLLM: golden files, and vLLM live if present.

Without vLLM (CI, most machines): replays every golden file under tests/parity/golden through
pagesim and prints one line per file. With vLLM importable (the opt-in check to run whenever the
pinned release changes; install recipe in docs/parity.md), it also replays each golden case
through vLLM itself, and reports
  * live vLLM vs the golden file of the same release (is the golden still what vLLM does?), and
  * pagesim vs live vLLM (does pagesim still match?).
Writes results/parity.csv. Exit code 1 if anything diverged.

    python benchmarks/parity.py                  # goldens only
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=<vllm>:. python benchmarks/parity.py --live [CASE ...]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pagesim.parity import compare_logs, golden_files, run_parity  # noqa: E402
from pagesim.parity.decisions import DecisionLog  # noqa: E402
from pagesim.parity.workloads import CASES, ParityWorkload, case_workload, golden_name  # noqa: E402


def _golden_rows(block_ids: str) -> list[dict]:
    rows = []
    for path in golden_files():
        t0 = time.perf_counter()
        report = run_parity(path, block_ids=block_ids)
        rows.append(_row("pagesim vs golden", path.name, report, time.perf_counter() - t0))
    return rows


def _live_rows(cases: list[str], block_ids: str) -> list[dict]:
    import vllm

    from pagesim.parity import record_pagesim, record_vllm

    compat = ".".join(vllm.__version__.split(".")[:2])
    rows = []
    for case in cases:
        t0 = time.perf_counter()
        live = record_vllm.record(case_workload(case), vllm_compat=compat)
        golden_path = ROOT / "tests" / "parity" / "golden" / golden_name(case, vllm.__version__)
        if golden_path.exists():
            golden = DecisionLog.read(golden_path)
            rows.append(
                _row(
                    f"vllm {vllm.__version__} live vs golden",
                    golden_path.name,
                    compare_logs(golden, live),
                    time.perf_counter() - t0,
                )
            )
        ours = record_pagesim.record(ParityWorkload.from_json(live.workload), vllm_compat=compat)
        rows.append(
            _row(
                f"pagesim vs vllm {vllm.__version__} live",
                case,
                compare_logs(live, ours, block_ids=block_ids),
                time.perf_counter() - t0,
            )
        )
    return rows


def _row(check: str, name: str, report, seconds: float) -> dict:
    if not report.ok:
        print(report.format(), file=sys.stderr)
    d = report.divergence
    return {
        "check": check,
        "case": name,
        "ok": report.ok,
        "steps": report.steps_compared,
        "first_divergence": "" if d is None else f"t={d.t} {d.what} {d.request_id or ''}",
        "seconds": round(seconds, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help=f"live cases (default all): {' '.join(CASES)}")
    ap.add_argument("--live", action="store_true", help="also run vLLM itself (must import)")
    ap.add_argument("--block-ids", default="exact", choices=("exact", "renamed"))
    ap.add_argument("--csv", default=str(ROOT / "results" / "parity.csv"))
    args = ap.parse_args()
    rows = _golden_rows(args.block_ids)
    if args.live:
        if importlib.util.find_spec("vllm") is None:
            print("--live: vllm is not importable; see docs/parity.md", file=sys.stderr)
            return 2
        rows += _live_rows(args.cases or list(CASES), args.block_ids)
    width = max(len(r["check"]) + len(r["case"]) for r in rows) + 3
    for r in rows:
        status = "MATCH" if r["ok"] else f"DIVERGED {r['first_divergence']}"
        print(
            f"{r['check'] + ': ' + r['case']:<{width}} {r['steps']:>6} steps "
            f"{r['seconds']:>6.1f} s  {status}"
        )
    Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.csv}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
