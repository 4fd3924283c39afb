"""Every new model family (MoE, MLA, hybrid sliding window) runs `pagesim run`, `sweep` and
`plan` end to end, from its shipped name and from a config.json path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagesim.cli.app import main
from pagesim.data import models_dir

FAMILIES = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite", "gemma-2-9b", "gpt-oss-20b")
LOAD = ["--workload", "random", "--random-input-len", "256", "--random-output-len", "32"]


@pytest.mark.parametrize("model", FAMILIES)
def test_run_sweep_plan(model: str, tmp_path: Path, capsys) -> None:
    result = tmp_path / "run.json"
    rc = main(
        [
            "run",
            "--model",
            model,
            *LOAD,
            "--num-prompts",
            "20",
            "--save-result",
            "--result-filename",
            str(result),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Serving Benchmark Result" in out
    doc = json.loads(result.read_text())
    assert doc["completed"] == 20 and doc["mean_tpot_ms"] > 0
    rc = main(
        [
            "sweep",
            "--model",
            model,
            *LOAD,
            "--num-prompts",
            "10",
            "--request-rate",
            "2,8",
            "-o",
            str(tmp_path / "sweep"),
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert len(list((tmp_path / "sweep").rglob("summary.csv"))) == 1
    rc = main(
        [
            "plan",
            "--model",
            model,
            *LOAD,
            "--num-prompts",
            "30",
            "--slo",
            "p99_ttft_ms<=2000",
            "--min-duration",
            "2",
            "--rel-tol",
            "0.2",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "Capacity plan (one replica)" in out and "Rate found within SLOs" in out


def test_run_from_a_config_folder(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "served-model"
    folder.mkdir()
    (folder / "config.json").write_text((models_dir() / "gpt-oss-20b.json").read_text())
    rc = main(["run", "--model", str(folder), *LOAD, "--num-prompts", "5"])
    assert rc == 0, capsys.readouterr()
