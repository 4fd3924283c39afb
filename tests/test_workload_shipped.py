"""Every shipped spec loads from files inside `workloads/` and samples a consistent plan."""

from __future__ import annotations

import gzip
import hashlib
import re

import numpy as np
import pytest

from pagesim.data import workloads_dir
from pagesim.sim.arrivals import session_arrival_times
from pagesim.workload import load_workload, shipped_workloads
from pagesim.workload.traces import read_trace


@pytest.mark.parametrize("name", shipped_workloads())
def test_shipped_workload_samples(name: str) -> None:
    w = load_workload(name)
    assert w.name == name and w.spec.description
    plan = w.sample(200, seed=0)
    assert plan.num_requests == 200
    assert plan.prompt_lens.min() >= 1 and plan.output_lens.min() >= 1
    for i in plan.first_turns[:20].tolist():
        tokens = plan.materialize(i)
        assert len(tokens) == plan.prompt_lens[i]
        assert 0 <= min(tokens) and max(tokens) < plan.vocab_size
    times = session_arrival_times(plan)
    assert times.shape == (plan.num_sessions,) and np.all(np.diff(times) >= 0)


def test_specs_read_only_shipped_files() -> None:
    for spec in sorted(workloads_dir().glob("*.yaml")):
        for ref in re.findall(r"^\s*trace:\s*(\S+)", spec.read_text(), re.M):
            path = (spec.parent / ref).resolve()
            assert path.is_relative_to(workloads_dir()), (spec.name, ref)
            assert path.is_file(), (spec.name, ref)


def test_shipped_traces_are_the_documented_files() -> None:
    """The README's SHA-256 of each uncompressed trace matches, and row counts are right."""
    readme = (workloads_dir() / "traces" / "README.md").read_text()
    listed = dict(re.findall(r"\| `([^`]+\.gz)` \|[^|]+\|[^|]+\| `([0-9a-f]{64})` \|", readme))
    files = sorted(
        p.relative_to(workloads_dir() / "traces").as_posix()
        for p in (workloads_dir() / "traces").rglob("*.gz")
    )
    assert sorted(listed) == files
    for rel, sha in listed.items():
        raw = gzip.decompress((workloads_dir() / "traces" / rel).read_bytes())
        assert hashlib.sha256(raw).hexdigest() == sha, rel
    conv = read_trace(
        workloads_dir() / "traces/azure-public-dataset/AzureLLMInferenceTrace_conv.csv.gz"
    )
    assert conv.num_rows == 19366 and conv.timestamps_s[-1] == pytest.approx(3501.7, abs=0.1)
