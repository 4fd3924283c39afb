"""Bad input to `pagesim run`: one line on stderr naming the problem, exit code 2, never a
traceback. In process through `main([...])`, plus real calls of the console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagesim.cli.app import main

FILES = {
    "bad.yaml": "model: [llama-2-7b\nblock_size: 16\n",
    "list.yaml": "- a\n- b\n",
    "unknown.yaml": "bogus_setting: 1\n",
    "typed-int.yaml": "block_size: abc\n",
    "typed-float.yaml": "request_rate: fast\n",
    "typed-bool.yaml": "enable_prefix_caching: maybe\n",
    "typed-frac.yaml": "num_prompts: 2.5\n",
    "goodput.yaml": "goodput: 5\n",
    "badspec.yaml": "name: x\nlengths: {random: {input_len: [\n",
    "schema.yaml": "name: x\nlengths: {random: {input_len: 10}}\nbogus_section: 1\n",
    "missing.csv": "timestamp,input_length\n0,10\n",
    "mamba.json": '{"architectures": ["MambaForCausalLM"], "hidden_size": 64}',
    "partial.json": '{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
    "notjson.json": "{architectures",
    "slow.yaml": "lengths: {input: 10, output: 5}\narrival: {process: poisson, rate: 1.0e-15}\n",
    "stretch.yaml": "time_scale: 1.0e+300\n",
    "negative.csv": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,-5,10\n2023-11-16 18:15:47.6805900,20,10\n"
    ),
}

# (argv after `run --quiet`, a piece of the message)
BAD = [
    (["--config", "bad.yaml"], "malformed YAML"),
    (["--config", "list.yaml"], "mapping"),
    (["--config", "unknown.yaml"], "bogus_setting"),
    (["--config", "nowhere.yaml"], "no such file"),
    (["--config", "typed-int.yaml"], "block_size='abc'"),
    (["--config", "typed-float.yaml"], "request_rate='fast'"),
    (["--config", "typed-bool.yaml"], "enable_prefix_caching='maybe'"),
    (["--config", "typed-frac.yaml"], "num_prompts=2.5"),
    (["--config", "goodput.yaml"], "--goodput"),
    (["--workload", "badspec.yaml"], "malformed YAML"),
    (["--workload", "schema.yaml"], "bogus_section"),
    (["--workload", "missing.csv"], "missing columns"),
    (["--workload", "negative.csv"], "-5"),
    (["--workload", "nosuch"], "unknown workload 'nosuch'"),
    (["--workload", "chat:0.7+code"], "workload mix 'chat:0.7+code': no weight for 'code'"),
    (["--model", "nosuch"], "unknown model 'nosuch'"),
    (["--model", "mamba.json"], "architecture MambaForCausalLM is not modelled"),
    (["--model", "partial.json"], "missing 'num_attention_heads'"),
    (["--model", "notjson.json"], "not valid JSON"),
    (["--gpu", "nosuch"], "unknown GPU 'nosuch'"),
    (["--num-gpu-blocks-override", "0"], "num_gpu_blocks_override=0"),
    (["--num-gpu-blocks-override", "1"], "num_gpu_blocks=1"),  # the null block only
    (["--gpu-memory-utilization", "0.1"], "max_model_len=4096"),  # no room for one request
    (["--gpu-memory-utilization", "0.097"], "leave no KV cache memory"),  # zero blocks
    (["--block-size", "0"], "block_size=0"),
    (["--max-model-len", "999999"], "max_model_len=999999"),
    (["--model", "llama-2-70b", "--gpu", "a10g"], "do not fit"),
    (["--request-rate", "0"], "request_rate=0.0"),
    (["--request-rate", "-1"], "request_rate=-1.0"),
    (["--request-rate", "abc"], "--request-rate"),
    (["--request-rate", "1e-15"], "request_rate=1e-15: 3 arrivals would span 3e+15 s"),
    (["--request-rate", "5e-324"], "the smallest request_rate for num_prompts=3 is 3e-09"),
    (["--workload", "slow.yaml"], "workload 'slow' arrival.rate=1e-15"),
    (["--config", "stretch.yaml", "--workload", "code"], "time_scale = 1e+300"),
    (["--preemption-mode", "bogus"], "preemption_mode='bogus'"),
    (["--allocator", "bogus"], "allocator='bogus'"),
    (["--num-prompts", "0"], "num_prompts=0"),
    (["--max-concurrency", "0"], "max_concurrency=0"),
    (["--burstiness", "0"], "burstiness=0.0"),
    (["--goodput", "foo:1"], "--goodput 'foo:1'"),
    (["--metric-percentiles", "100"], "percentile 100"),
    (["--metric-percentiles", "a,b"], "--metric-percentiles"),
    (["--workload", "random", "--random-range-ratio", "2"], "random_range_ratio"),
    (["--profile", "no-such-profile"], "no-such-profile"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--config", "."], "cannot read"),  # a directory
    (["--config", "binary.yaml"], "not UTF-8"),
    (["--result-dir", "bad.yaml"], "--result-dir bad.yaml"),  # a file, not a directory
    (["--result-dir", "bad.yaml/sub"], "--result-dir bad.yaml/sub"),
]


@pytest.fixture
def bad_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.yaml").write_bytes(b"model: \xff\xfe\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def assert_one_line_error(rc: int, out: str, err: str, needle: str) -> None:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Serving Benchmark Result" not in out


@pytest.mark.parametrize(("argv", "needle"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, bad_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["run", "--quiet", "--num-prompts", "3", *argv])
    out, err = capsys.readouterr()
    assert_one_line_error(rc, out, err, needle)


def test_a_result_file_that_cannot_be_written_is_one_line(
    bad_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Saving into a directory's name is refused before the run, in one line."""
    (bad_files / "taken.json").mkdir()
    rc = main(
        [
            "run",
            "--quiet",
            "--num-prompts",
            "2",
            "--workload",
            "random",
            "--random-input-len",
            "16",
            "--random-output-len",
            "2",
            "--save-result",
            "--result-filename",
            "taken.json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in out + err
    assert [line for line in err.splitlines() if line.strip()] == [
        "error: --result-filename taken.json: is a directory; give a file name"
    ]


def test_a_result_files_folder_is_made_before_the_run_as_result_dirs_is(
    bad_files: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing folder in --result-filename is created; one that cannot be is refused before
    the run, in one line naming the path given (not the temporary file written through)."""
    argv = ["run", "--quiet", "--num-prompts", "2", "--save-result", "--result-filename"]
    assert main([*argv, str(bad_files / "x" / "y" / "z.json")]) == 0
    assert json.loads((bad_files / "x" / "y" / "z.json").read_text())["completed"] == 2
    capsys.readouterr()
    rc = main([*argv, "/proc/nope/z.json"])
    out, err = capsys.readouterr()
    # as root every check passes and mkdir refuses ("cannot create"); as another user the
    # checks refuse /proc first ("not writable"): either way one line naming the path given
    assert_one_line_error(rc, out, err, "--result-filename /proc/nope/z.json: ")


@pytest.mark.parametrize("flag", ["--swap-space", "--long-prefill-token-threshold"])
def test_errors_state_the_real_bound(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--quiet", flag, "-1"])
    out, err = capsys.readouterr()
    assert_one_line_error(rc, out, err, ">= 0")


def test_the_console_script_reports_bad_input_in_one_line(bad_files: Path) -> None:
    beside = Path(sys.executable).with_name("pagesim")
    script = str(beside) if beside.exists() else shutil.which("pagesim")
    assert script, "the pagesim console script is not installed"
    for argv, needle in (
        [["--preemption-mode", "bogus"], "preemption_mode='bogus'"],
        [["--config", "bad.yaml"], "malformed YAML"],
    ):
        proc = subprocess.run(
            [script, "run", "--quiet", *argv],
            cwd=bad_files,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, needle)


def test_an_internal_error_is_reported_as_a_bug_with_exit_1(monkeypatch, capsys) -> None:
    import importlib

    from pagesim.errors import InternalError

    app_module = importlib.import_module("pagesim.cli.app")  # the module, not the Typer app

    def broken(**_: object) -> None:
        raise InternalError("block 7 leaked")

    app_module._register()  # the command modules register on the real app, not on `broken`
    monkeypatch.setattr(app_module, "app", broken)
    assert app_module.main(["run"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "InternalError: block 7 leaked" in err
    assert err.strip().splitlines()[-1].startswith("internal error: this is a bug in pagesim")
