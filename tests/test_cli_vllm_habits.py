"""What a `vllm bench serve` user types works: unquoted --goodput items, --percentile-metrics,
--dataset-name; `pagesim models` lists the names; GPU commands without a GPU say so before
importing anything heavy."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from pagesim.cli.app import main, split_multi_items
from pagesim.gpu.device import cuda_driver_devices
from pagesim.specs import GPUS, MODELS

SMALL = ["--workload", "random", "--random-input-len", "64", "--random-output-len", "8"]


def test_multi_item_flags_are_split_as_vllm_bench_takes_them() -> None:
    assert split_multi_items(["run", "--goodput", "ttft:500", "tpot:50", "--seed", "1"]) == [
        "run",
        "--goodput",
        "ttft:500",
        "--goodput",
        "tpot:50",
        "--seed",
        "1",
    ]
    # a flag's own value is never split off; an item after another flag is left alone
    assert split_multi_items(["plan", "--slo", "p99_ttft_ms<=5", "ttft:9"]) == [
        "plan",
        "--slo",
        "p99_ttft_ms<=5",
        "--slo",
        "ttft:9",
    ]
    assert split_multi_items(["run", "--workload", "ttft:5"]) == ["run", "--workload", "ttft:5"]


def test_unquoted_goodput_equals_the_quoted_form(capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for goodput in (["ttft:300", "tpot:50"], ["ttft:300 tpot:50"]):
        assert main(["run", "--quiet", *SMALL, "--num-prompts", "30", "--goodput", *goodput]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and "Request goodput (req/s):" in outs[0]


def test_percentile_metrics_choose_the_printed_sections(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["run", "--quiet", *SMALL, "--num-prompts", "5", "--metric-percentiles", "50,99"]
    assert main([*args, "--percentile-metrics", "ttft,itl"]) == 0
    out = capsys.readouterr().out
    assert "P50 TTFT (ms):" in out and "P99 ITL (ms):" in out
    assert "TPOT" not in out and "E2EL" not in out
    assert main([*args, "--percentile-metrics", "ttft,latency"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--percentile-metrics 'ttft,latency'" in err


def test_dataset_name_is_the_workload(capsys: pytest.CaptureFixture[str]) -> None:
    outs = []
    for flags in (["--dataset-name", "sharegpt"], ["--workload", "chat"]):
        assert main(["run", "--quiet", *flags, "--num-prompts", "8"]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]


def test_models_lists_every_model_and_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = [r["model"] for r in doc["models"]]
    assert names[: len(MODELS)] == list(MODELS)  # then the shipped configs' other families
    assert {"mixtral-8x7b", "deepseek-v2-lite", "gemma-2-9b"} <= set(names)
    assert [r["gpu"] for r in doc["gpus"]] == list(GPUS)
    llama = doc["models"][0]
    assert llama["model"] == "llama-2-7b" and llama["kv_kib_per_token"] == 512  # 2*32*32*128*2 B
    assert "h200" in llama["profiles"]
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert (
        re.search(r"^h200 +139\.8 GiB 4\.80 TB/s", out, re.M) and "meta-llama/Llama-2-7b-hf" in out
    )
    assert main(["kv-capacity", "--help"]) == 0
    assert "pagesim models" in capsys.readouterr().out


@pytest.mark.skipif(cuda_driver_devices() != 0, reason="this machine has a GPU")
@pytest.mark.parametrize(
    ("command", "hint"), [("calibrate", False), ("validate", True)], ids=["calibrate", "validate"]
)
def test_gpu_commands_fail_at_once_without_a_gpu(command: str, hint: bool) -> None:
    """One line, exit 2, and neither torch nor the simulator was imported to say so."""
    code = (
        f"import sys; from pagesim.cli.app import main; rc = main([{command!r}]); "
        "print(rc, 'torch' in sys.modules, 'pandas' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "needs a CUDA GPU" in done.stderr
    assert ("--real RUN.json" in done.stderr) is hint
