"""`run_parity`: replay a golden file's workload through pagesim and compare the decisions."""

from __future__ import annotations

from pathlib import Path

from pagesim.data import golden_dir
from pagesim.parity.compare import ParityReport, compare_logs
from pagesim.parity.decisions import DecisionLog
from pagesim.parity.record_pagesim import record
from pagesim.parity.workloads import ParityWorkload


def run_parity(
    golden_path: str | Path, block_ids: str = "exact", vllm_compat: str | None = None
) -> ParityReport:
    """Replay the workload stored in `golden_path` through pagesim's Scheduler and
    KVCacheManager, following the vLLM release the file was recorded with (or `vllm_compat`),
    and compare step by step. `report.ok` is True on an exact match; `report.format()` says
    where and how the first divergence happened."""
    golden = DecisionLog.read(golden_path)
    workload = ParityWorkload.from_json(golden.workload)
    candidate = record(workload, vllm_compat=vllm_compat or golden.vllm_compat)
    return compare_logs(golden, candidate, block_ids=block_ids)


def golden_files(directory: str | Path | None = None) -> list[Path]:
    """The golden decision files (the shipped ones by default), sorted by name."""
    return sorted(Path(directory or golden_dir()).glob("*.json*"))
