"""Nothing passes unsaid: rejected requests in `run`, `sweep` and `plan`, how a trace covers
`--num-prompts`, result files named after the arrival process used, and saved results that
name their profile without an absolute path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from pagesim.cli.app import main
from pagesim.metrics.report import rejection_line
from pagesim.workload import load_workload

LONG = [
    "--workload",
    "random",
    "--random-input-len",
    "300",
    "--random-range-ratio",
    "0.5",
    "--random-output-len",
    "4",
    "--max-model-len",
    "300",
]


def rejected_line(text: str) -> str:
    (line,) = [x for x in text.splitlines() if "Rejected" in x and "never served" in x]
    return line


def test_rejection_line_counts_add_up() -> None:
    result = {
        "num_rejected": 7,
        "completed": 13,
        "failed": 7,
        "rejected_reasons": {"max_tokens_too_large": 2, "prompt_too_long": 5},
        "engine_config": {"max_model_len": 300},
    }
    assert rejection_line(result) == (
        "Rejected 7 of 20 requests, never served: 5 prompt_too_long (prompt > max_model_len "
        "300), 2 max_tokens_too_large (prompt + max_tokens > max_model_len 300)"
    )
    assert rejection_line({**result, "num_rejected": 0}) is None


def test_run_says_how_many_were_rejected_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--quiet", *LONG, "--num-prompts", "20"]) == 0
    out, err = capsys.readouterr()
    m = re.fullmatch(
        r"Rejected (\d+) of 20 requests, never served: (\d+) prompt_too_long .*", rejected_line(err)
    )
    assert m and m.group(1) == m.group(2)
    assert err.strip().splitlines()[-1] == (
        "A model with a longer context serves them: `pagesim models` lists each one's."
    )
    done = int(re.search(r"Successful requests: +(\d+)", out).group(1))
    assert done + int(m.group(1)) == 20
    assert main(["run", "--quiet", *LONG[:6], "--num-prompts", "5"]) == 0
    assert "never served" not in "".join(capsys.readouterr())


def test_sweep_lists_the_points_that_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["sweep", "--quiet", "-o", str(tmp_path), *LONG[:8], "--num-prompts", "12"]
    assert main([*args, "--max-model-len", "300,4096"]) == 0
    out, err = capsys.readouterr()
    assert "0 failed, 1 with rejected requests" in out
    line = rejected_line(err)
    assert line.startswith("rejected: ENGINE-max_model_len=300 run=0: Rejected ")
    (summary,) = tmp_path.glob("*/summary.csv")
    frame = pd.read_csv(summary)
    assert list(frame["num_rejected"] > 0) == [True, False]
    assert (frame["completed"] + frame["num_rejected"] == 12).all()
    assert set(frame["profile"]) == {"calibration/h200/llama-2-7b"}
    (run_file,) = tmp_path.glob("*/ENGINE-max_model_len=300/run=0.json")
    doc = json.loads(run_file.read_text())
    assert doc["cost_model"] == "calibrated"
    assert doc["profile"]["path"] == "calibration/h200/llama-2-7b"
    assert doc["profile"]["name"] == "h200/llama-2-7b" and doc["profile"]["format_version"] >= 1


def test_plan_refuses_a_rate_that_rejects_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", *LONG, "--num-prompts", "20", "--slo", "p99_ttft_ms<=2000"]
    args += ["--min-duration", "2", "--rel-tol", "0.3"]
    out_file = tmp_path / "plan.json"
    assert main([*args, "--save-result", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Rate found within SLOs: +none: Rejected \d+ of 20 requests", out, re.M)
    assert "--allow-rejected plans for the rest" in out
    doc = json.loads(out_file.read_text())
    assert doc["capacity"]["max_rate"] is None and doc["capacity"]["probes"] == []
    assert doc["profile"]["path"] == "calibration/h200/llama-2-7b"
    assert main([*args, "--allow-rejected", "--save-result", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out_file.read_text())["capacity"]["max_rate"] > 0
    assert re.search(r"^Rejected at it \(allowed\): +Rejected \d+ of \d+ requests", out, re.M)


@pytest.fixture
def short_trace(tmp_path: Path) -> Path:
    """A 30-row Azure-format trace, one request every 0.5 s."""
    path = tmp_path / "short.csv"
    rows = [
        f"2023-11-16 18:00:{i // 2:02d}.{5 * (i % 2)}000000,{64 + i},{4 + i % 3}" for i in range(30)
    ]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    assert load_workload(str(path)).spec.trace.num_rows == 30
    return path


def test_a_short_trace_is_replayed_once_and_named_after_its_arrivals(
    short_trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--quiet",
                "--workload",
                str(short_trace),
                "--save-result",
                "--result-dir",
                str(out_dir),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert "--num-prompts not given: replaying the trace's 30 rows once" in err
    assert re.search(r"Successful requests: +30\b", out)
    (name,) = [p.name for p in out_dir.glob("*.json")]
    assert re.fullmatch(r"pagesim-trace-llama-2-7b-\d{8}-\d{6}\.json", name)
    assert main(["run", "--quiet", "--workload", str(short_trace), "--num-prompts", "100"]) == 0
    err = capsys.readouterr().err
    assert "Trace of 30 rows replayed 4 times to send 100 prompts" in err


def test_a_long_trace_defaults_to_the_usual_count_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pagesim.cli.run as run_module

    monkeypatch.setitem(run_module.DEFAULTS, "num_prompts", 40)
    assert main(["run", "--quiet", "--workload", "code", "--max-num-seqs", "16"]) == 0
    out, err = capsys.readouterr()
    assert "replaying the first 40 of the trace's 8819 rows (--num-prompts 8819" in err
    done = int(re.search(r"Successful requests: +(\d+)", out).group(1))
    failed = int(re.search(r"Failed requests: +(\d+)", out).group(1))
    assert done + failed == 40


def test_run_takes_an_inline_mix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--quiet", "--workload", "chat:0.7+random:0.3", "--num-prompts", "20"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"Successful requests: +20\b", out)


def test_kv_cache_memory_bytes_sizes_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    # llama-2-7b fp16: 512 KiB per token, 8 MiB per 16-token block
    args = ["run", "--quiet", *LONG[:6], "--num-prompts", "4"]
    assert main([*args, "--kv-cache-memory-bytes", str(300 * 2**23)]) == 0
    assert re.search(r"GPU KV cache blocks: +300\b", capsys.readouterr().out)
