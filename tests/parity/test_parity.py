"""pagesim against the golden decision files recorded from vLLM (no vLLM needed).

Each shipped golden file (pagesim/data/parity/) holds a workload and every decision vLLM's v1 Scheduler and
KVCacheManager made on it; pagesim must reproduce all of them exactly (docs/parity.md).
"""

from __future__ import annotations

import gzip
import json

import pytest

from pagesim.parity import golden_files, run_parity
from pagesim.parity.workloads import CASES, case_workload, default_trace_path

GOLDEN = golden_files()


def test_golden_files_cover_the_required_workloads():
    names = {p.name.split(".vllm-")[0] for p in GOLDEN}
    assert {"shared_prefix", "multi_turn", "random_pressure", "mooncake"} <= names
    versions = {p.name.split(".vllm-")[1].removesuffix(".json.gz") for p in GOLDEN}
    assert {"0.33.0", "0.23.0"} <= versions


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_pagesim_matches_vllm_decisions(path):
    report = run_parity(path)
    assert report.ok, report.format()
    # the replay really exercised what the file claims
    assert report.steps_compared == report.summary["steps"] > 0


def test_hybrid_layouts_have_golden_files():
    """Gemma-style (sliding window + full attention, alternating, and Gemma 3's 5:1) and
    gpt-oss-style layouts, recorded from vLLM's HybridKVCacheCoordinator."""
    names = {p.name.split(".vllm-")[0] for p in GOLDEN}
    hybrid = {n for n in names if "kv_cache_groups" in CASES[n][1]}
    assert {"gemma2_mooncake", "gemma3_multi_turn", "gpt_oss_shared_prefix"} <= hybrid
    assert "gpt_oss_random_pressure" in hybrid  # preemption under windows


def test_hybrid_without_window_freeing_is_caught(monkeypatch):
    """A hybrid golden replayed with the sliding-window groups never freeing must diverge."""
    from pagesim.kvcache.single_type_kv_cache_manager import SlidingWindowManager

    monkeypatch.setattr(SlidingWindowManager, "remove_skipped_blocks", lambda self, r, n: None)
    path = next(p for p in GOLDEN if p.name == "gpt_oss_shared_prefix.vllm-0.33.0.json.gz")
    report = run_parity(path)
    assert not report.ok and "DIVERGED at step" in report.format()


def test_golden_workloads_are_not_trivial():
    """Hits, evictions and preemptions all occur somewhere, so matching them means something."""
    totals = {"hit_tokens": 0, "evictions": 0, "preemptions": 0}
    for path in GOLDEN:
        summary = json.loads(gzip.decompress(path.read_bytes()))["summary"]
        for key in totals:
            totals[key] += summary[key]
    assert all(v > 0 for v in totals.values()), totals


def test_wrong_free_order_is_caught():
    """Replaying a 0.33.0 golden with the 0.23 free order must diverge, and say where."""
    path = next(p for p in GOLDEN if p.name == "shared_prefix.vllm-0.33.0.json.gz")
    report = run_parity(path, vllm_compat="0.23")
    assert not report.ok
    assert report.divergence is not None and report.divergence.t > 0
    assert "DIVERGED at step" in report.format()


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_holds_the_current_case_workload(path):
    """A golden file is the record of `case_workload(case)` as defined now (re-record if not)."""
    case = path.name.split(".vllm-")[0]
    if CASES[case][0] == "mooncake" and not default_trace_path().exists():
        pytest.skip("the Mooncake trace is not beside the checkout")
    stored = json.loads(gzip.decompress(path.read_bytes()))["workload"]
    assert stored == case_workload(case).to_json()
