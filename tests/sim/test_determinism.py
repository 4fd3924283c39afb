"""Same seed, same output: the result JSON (its `date` aside) and the Parquet files are the same
bytes in any process; a different seed gives a different run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pagesim.config import EngineConfig
from pagesim.sim.output import requests_table, steps_table
from pagesim.sim.simulate import LoadSpec, simulate

RUN_ARGS = [
    "run",
    "--quiet",
    "--workload",
    "system-prompt",
    "--num-prompts",
    "20",
    "--request-rate",
    "10",
    "--num-gpu-blocks-override",
    "128",
    "--block-size",
    "32",
    "--seed",
    "7",
    "--result-filename",
    "run.json",
]


def pagesim_script() -> str:
    """The installed `pagesim` console script (next to this interpreter if it is there)."""
    beside = Path(sys.executable).with_name("pagesim")
    found = str(beside) if beside.exists() else shutil.which("pagesim")
    assert found, "the pagesim console script is not installed"
    return found


def test_two_processes_write_the_same_bytes(tmp_path: Path) -> None:
    """Two CLI processes (different hash seeds) run side by side; JSON minus date and Parquet
    must match byte for byte."""
    procs = []
    for k in (1, 2):
        env = {**os.environ, "PYTHONHASHSEED": str(k)}
        args = [pagesim_script(), *RUN_ARGS, "--result-dir", str(tmp_path / f"d{k}")]
        procs.append(
            subprocess.Popen(
                args,
                cwd=tmp_path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "Serving Benchmark Result" in out
    a, b = tmp_path / "d1", tmp_path / "d2"
    names = sorted(p.name for p in a.iterdir())
    assert names == ["run.json", "run.requests.parquet", "run.steps.parquet"]
    assert names == sorted(p.name for p in b.iterdir())
    ja, jb = (json.loads((d / "run.json").read_text()) for d in (a, b))
    assert ja.pop("date") and jb.pop("date")
    assert ja == jb
    # a run with some pressure and sharing, so that order matters
    assert ja["completed"] == 20 and ja["num_preemptions"] > 0
    assert ja["prefix_cache_hit_rate"] > 0
    text_a = (a / "run.json").read_text().splitlines()
    text_b = (b / "run.json").read_text().splitlines()
    assert [ln for ln in text_a if '"date"' not in ln] == [
        ln for ln in text_b if '"date"' not in ln
    ]
    for name in names[1:]:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # stdout is the same too, the block and the KV block line for line
    assert outs[0][0].replace(str(a), "D") == outs[1][0].replace(str(b), "D")


def test_same_seed_same_records_in_process() -> None:
    config = EngineConfig.create(num_gpu_blocks_override=48)
    load = LoadSpec(
        workload="random",
        num_prompts=25,
        random_input_len=200,
        random_output_len=60,
        random_range_ratio=0.5,
        request_rate=30.0,
        seed=3,
    )
    one, two = simulate(config, load), simulate(config, load)
    assert one.result == two.result
    assert requests_table(one.metrics).equals(requests_table(two.metrics))
    assert steps_table(one.metrics).equals(steps_table(two.metrics))
    assert list(one.metrics.itl_s) == list(two.metrics.itl_s)
    other = simulate(config, LoadSpec(**{**load.__dict__, "seed": 4}))
    assert other.result["total_input_tokens"] != one.result["total_input_tokens"]
    assert not requests_table(other.metrics).equals(requests_table(one.metrics))
