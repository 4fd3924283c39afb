"""`pagesim run` in process: the no-argument run, the printed blocks against the saved JSON,
result files, `--config` precedence, and the load flags' effect on the block."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import pagesim.cli.run as run_module
from pagesim.cli.app import main
from pagesim.data import calibration_dir
from pagesim.metrics import STEP_COLUMNS
from pagesim.sim.output import REQUEST_COLUMNS

SMALL = ["--workload", "random", "--random-input-len", "64", "--random-output-len", "8"]


def run_ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(["run", "--quiet", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "Traceback" not in out + err
    return out


def block_values(out: str) -> dict[str, str]:
    """'Label:' -> value text of every row of the printed blocks."""
    rows = {}
    for line in out.splitlines():
        m = re.fullmatch(r"(.{40}) (\S+) *", line)
        if m and m.group(1).rstrip().endswith(":"):
            rows[m.group(1).strip()] = m.group(2)
    return rows


def assert_block_layout(out: str) -> None:
    """Both printed blocks: headers 50 wide, rows '{:<40} {:<10}' (51 wide for short values)."""
    lines = out.splitlines()
    first = lines.index("============ Serving Benchmark Result ============")
    kv = lines.index("================ KV Cache Result =================")
    ends = [i for i, line in enumerate(lines) if line == "=" * 50]
    assert len(ends) == 2 and first < ends[0] < kv < ends[1]
    for line in lines[first : ends[1] + 1]:
        if line[0] in "=-":
            assert len(line) == 50, line
        else:
            assert len(line) == 51 and line[40] == " " and line[:40].rstrip().endswith(":"), line


def test_run_with_no_arguments(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's first command. The real default is 1000 chat prompts (several seconds);
    the same path runs here with 60, everything else left at its default."""
    assert run_module.DEFAULTS == {"workload": "chat", "num_prompts": 1000}
    monkeypatch.setattr(run_module, "DEFAULTS", {"workload": "chat", "num_prompts": 60})
    rc = main(["run"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in out + err
    lines = out.splitlines()
    assert lines[0] == "Simulated llama-2-7b on h200, block size 16: workload chat, 60 prompts"
    assert lines[1] == "============ Serving Benchmark Result ============"
    assert "================ KV Cache Result =================" in lines
    rows = block_values(out)
    assert rows["Successful requests:"] == "60" and rows["Failed requests:"] == "0"
    assert "Request rate configured (RPS):" not in rows  # inf: no rate line, as vllm bench
    assert "Maximum request concurrency:" not in rows
    assert float(rows["Output token throughput (tok/s):"]) > 0
    assert int(rows["GPU KV cache blocks:"]) > 1000  # llama-2-7b on an H200 at 0.92
    assert_block_layout(out)
    assert lines[-1].startswith(
        "Cost model: calibrated, the shipped profile "
        "calibration/h200/llama-2-7b (NVIDIA H200, bfloat16, measured "
    )


def test_the_last_line_says_what_priced_the_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A profile given by path is named by it; with none for the model, GPU and TP size, the
    analytical model prices the steps and the line says so."""
    profile = calibration_dir() / "h200" / "llama-3-8b"
    out = run_ok(
        capsys, *SMALL, "--num-prompts", "4", "--model", "llama-3-8b", "--profile", str(profile)
    )
    assert out.splitlines()[-1].startswith(
        "Cost model: calibrated, the shipped profile calibration/h200/llama-3-8b ("
    )
    other = tmp_path / "mine"
    shutil.copytree(profile, other)
    out = run_ok(
        capsys, *SMALL, "--num-prompts", "4", "--model", "llama-3-8b", "--profile", str(other)
    )
    assert out.splitlines()[-1].startswith(f"Cost model: calibrated, {other} (NVIDIA H200, ")
    args = ("--num-prompts", "4", "--gpu", "a100-80gb", "--model", "mistral-7b")
    out = run_ok(capsys, *SMALL, *args)  # no profile of mistral-7b on any GPU
    assert out.splitlines()[-1] == (
        "Cost model: analytical (no calibration profile for "
        "mistral-7b on a100-80gb at TP 1; --profile DIR uses one)"
    )


def test_printed_blocks_match_the_saved_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_ok(
        capsys,
        *SMALL,
        "--num-prompts",
        "12",
        "--request-rate",
        "40",
        "--max-concurrency",
        "4",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "r.json",
    )
    doc = json.loads((tmp_path / "r.json").read_text())
    rows = block_values(out)
    assert rows["Successful requests:"] == str(doc["completed"]) == "12"
    assert rows["Maximum request concurrency:"] == "4"
    assert rows["Request rate configured (RPS):"] == "40.00"
    for label, key in [
        ("Benchmark duration (s):", "duration"),
        ("Request throughput (req/s):", "request_throughput"),
        ("Output token throughput (tok/s):", "output_throughput"),
        ("Total token throughput (tok/s):", "total_token_throughput"),
        ("Mean TTFT (ms):", "mean_ttft_ms"),
        ("P99 ITL (ms):", "p99_itl_ms"),
        ("Median TPOT (ms):", "median_tpot_ms"),
        ("Mean E2EL (ms):", "mean_e2el_ms"),
    ]:
        assert rows[label] == f"{doc[key]:.2f}", label
    assert rows["Total input tokens:"] == str(doc["total_input_tokens"]) == str(12 * 64)
    assert rows["Total generated tokens:"] == str(doc["total_output_tokens"]) == str(12 * 8)
    assert rows["Preemptions:"] == str(doc["num_preemptions"])
    assert rows["GPU KV cache blocks:"] == str(doc["num_gpu_blocks"])
    for label, key in [
        ("KV cache usage, mean (%):", "kv_cache_usage_mean"),
        ("KV cache usage, peak (%):", "kv_cache_usage_peak"),
        ("Token states:", "kv_token_state_frac"),
        ("Free:", "kv_free_frac"),
        ("Prefix cache hit rate (%):", "prefix_cache_hit_rate"),
    ]:
        assert rows[label] == f"{100 * doc[key]:.2f}", label
    assert rows["Peak running requests:"] == str(doc["max_num_running"])
    assert float(rows["Peak concurrent requests:"]) == doc["max_concurrent_requests"]
    for key, value in [
        ("backend", "pagesim"),
        ("model_id", "llama-2-7b"),
        ("gpu", "h200"),
        ("workload", "random"),
        ("num_prompts", 12),
        ("request_rate", 40.0),
        ("burstiness", 1.0),
        ("max_concurrency", 4),
        ("seed", 0),
    ]:
        assert doc[key] == value, key
    assert re.fullmatch(r"\d{8}-\d{6}", doc["date"])
    assert "Saved result to" in out


def test_result_dir_writes_parquet_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_ok(
        capsys,
        *SMALL,
        "--num-prompts",
        "9",
        "--result-dir",
        str(tmp_path / "res"),
        "--result-filename",
        "x.json",
    )
    doc = json.loads((tmp_path / "res" / "x.json").read_text())
    reqs = pq.read_table(tmp_path / "res" / "x.requests.parquet")
    steps = pq.read_table(tmp_path / "res" / "x.steps.parquet")
    assert tuple(reqs.column_names) == REQUEST_COLUMNS and reqs.num_rows == 9
    assert tuple(steps.column_names) == STEP_COLUMNS and steps.num_rows == doc["num_steps"]
    assert sum(reqs.column("num_output_tokens").to_pylist()) == doc["total_output_tokens"]


def test_save_result_uses_vllm_bench_default_filename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run_ok(capsys, *SMALL, "--num-prompts", "3", "--max-concurrency", "2", "--save-result")
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert re.fullmatch(r"pagesim-infqps-concurrency2-llama-2-7b-\d{8}-\d{6}\.json", name)
    # no --request-rate: the workload's own arrivals (inf for random), written as null
    assert json.loads((tmp_path / name).read_text())["request_rate"] is None
    run_ok(
        capsys,
        *SMALL,
        "--num-prompts",
        "3",
        "--request-rate",
        "inf",
        "--save-result",
        "--result-filename",
        "inf.json",
    )
    assert json.loads((tmp_path / "inf.json").read_text())["request_rate"] == "inf"


def test_config_file_and_flags_precedence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Flags > --config file > defaults, with vLLM's names in kebab or snake case."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "workload: random\nnum-prompts: 7\nrandom_input_len: 48\n"
        "random_output_len: 5\nblock_size: 32\nvllm_compat: 0.23\n"
        "metric_percentiles: '50,90'\ngoodput: ['ttft:100000']\n"
    )
    out = run_ok(
        capsys,
        "--config",
        str(cfg),
        "--num-prompts",
        "4",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "c.json",
    )
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["completed"] == 4  # the flag beats the file's 7
    assert doc["total_input_tokens"] == 4 * 48 and doc["total_output_tokens"] == 4 * 5
    assert doc["engine_config"]["block_size"] == 32
    assert doc["engine_config"]["vllm_compat"] == "0.23"  # YAML's float 0.23 read as the flag
    assert "p50_ttft_ms" in doc and "p90_itl_ms" in doc and "p99_ttft_ms" not in doc
    rows = block_values(out)
    assert "P90 TTFT (ms):" in rows and "P99 TTFT (ms):" not in rows
    assert doc["request_goodput"] == pytest.approx(doc["request_throughput"])
    assert rows["Request goodput (req/s):"] == f"{doc['request_goodput']:.2f}"


def test_engine_flags_reach_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_ok(
        capsys,
        *SMALL,
        "--random-output-len",
        "40",
        "--num-prompts",
        "20",
        "--num-gpu-blocks-override",
        "12",
        "--no-enable-prefix-caching",
        "--preemption-mode",
        "swap",
        "--max-num-seqs",
        "6",
        "--check-invariants",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "e.json",
    )
    doc = json.loads((tmp_path / "e.json").read_text())
    eng = doc["engine_config"]
    assert (
        eng["num_gpu_blocks_override"],
        eng["enable_prefix_caching"],
        eng["preemption_mode"],
        eng["max_num_seqs"],
    ) == (12, False, "swap", 6)
    assert doc["num_gpu_blocks"] == 12 and doc["max_num_running"] <= 6
    assert doc["completed"] == 20 and doc["num_swap_preemptions"] > 0
    assert doc["prefix_cache_hit_tokens"] == 0


def test_rejections_are_reported_in_the_kv_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run_ok(
        capsys,
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
        "--num-prompts",
        "20",
    )
    rows = block_values(out)
    rejected = int(rows["Rejected requests:"])
    assert rejected > 0 and rows["Failed requests:"] == str(rejected)
    assert int(rows["Successful requests:"]) + rejected == 20
    assert any(line.startswith("  prompt_too_long:") for line in out.splitlines())
    assert_block_layout(out)


def test_step_time_scale_prices_every_step_slower(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """All requests at t=0: the schedule does not depend on the step times, so the run takes
    1.1 times as long; the cost line and the saved result say so."""
    args = [*SMALL, "--num-prompts", "20", "--result-dir", str(tmp_path)]
    run_ok(capsys, *args, "--result-filename", "a.json")
    out = run_ok(capsys, *args, "--result-filename", "b.json", "--step-time-scale", "1.1")
    base, slow = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert slow["duration"] == pytest.approx(1.1 * base["duration"], rel=1e-9)
    assert slow["mean_tpot_ms"] == pytest.approx(1.1 * base["mean_tpot_ms"], rel=1e-9)
    (line,) = [x for x in out.splitlines() if x.startswith("Cost model:")]
    assert line.endswith("; every step x 1.1")
    assert slow["step_time_scale"] == 1.1 and "step_time_scale" not in base


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_bad_step_time_scale_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--quiet", *SMALL, "--step-time-scale", value]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "--step-time-scale" in err
        and "must be a number in [0.001, 1000]" in err
    )


@pytest.mark.parametrize("value", ["1e300", "1e-300", "1000.5"])
def test_a_step_time_scale_out_of_range_is_one_line(value: str, capsys) -> None:
    """A factor of 1e-300 or 1e300 would print a throughput of 1e12 or 300-digit times."""
    assert main(["run", "--quiet", *SMALL, "--step-time-scale", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--step-time-scale {float(value)!r}" in err
    assert "must be a number in [0.001, 1000]" in err


def test_the_help_gives_the_step_time_scale_default_once(capsys) -> None:
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "far past any real GPU's difference [1.0] --" in text and "[default: 1.0]" not in text


def test_the_band_reruns_at_the_profiles_spread_and_adds_only_its_own_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The band's block and JSON key come on top of the run's output; without it (--no-band)
    the run's output is what it was. Each range holds the run's own figure, and its ends are
    the prediction interval of the shipped profile's source levels."""
    from pagesim.cost.level_band import session_interval
    from pagesim.cost.profile import Profile

    args = [*SMALL, "--num-prompts", "40", "--request-rate", "20", "--result-dir", str(tmp_path)]
    out = run_ok(capsys, *args, "--result-filename", "band.json")
    plain = run_ok(capsys, *args, "--result-filename", "plain.json", "--no-band")
    lines = [x for x in out.splitlines() if not x.startswith("Saved ")]
    start = next(i for i, x in enumerate(lines) if x.startswith("Band across "))
    assert lines[-1].startswith("Cost model: ") and len(lines) - start == 10
    plain_lines = [x for x in plain.splitlines() if not x.startswith("Saved ")]
    assert lines[:start] + lines[-1:] == plain_lines
    band, base = (json.loads((tmp_path / f).read_text()) for f in ("band.json", "plain.json"))
    record = band.pop("band")
    assert band.keys() == base.keys()
    assert {k: v for k, v in band.items() if k != "date"} == {
        k: v for k, v in base.items() if k != "date"
    }
    scales = Profile.load_metadata(calibration_dir() / "h200" / "llama-2-7b").source_scales
    assert scales is not None
    assert (record["low"], record["high"]) == session_interval(scales)
    assert record["low"] < min(scales) and max(scales) < record["high"]
    assert set(record["metrics"]) >= {"request_throughput", "mean_tpot_ms", "p99_e2el_ms"}
    for key, (low, high) in record["metrics"].items():
        assert low <= base[key] <= high
    assert record["metrics"]["mean_tpot_ms"][1] > record["metrics"]["mean_tpot_ms"][0]


def test_a_transferred_gpus_band_is_wider_and_the_cost_line_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pagesim.sim.build import transfer_errors, transfer_served

    args = [*SMALL, "--num-prompts", "20", "--result-dir", str(tmp_path)]
    run_ok(capsys, *args, "--result-filename", "h200.json")
    out = run_ok(capsys, *args, "--result-filename", "h100.json", "--gpu", "h100-sxm")
    h200, h100 = (
        json.loads((tmp_path / f).read_text())["band"] for f in ("h200.json", "h100.json")
    )
    # the GEMM error, or the H100's served runs' end-to-end error where that is larger
    served = transfer_served().get("h100-sxm")
    pct = max(transfer_errors()["h100-sxm"].gemm, served.mean_tpot_pct if served else 0.0)
    assert h100["low"] == pytest.approx(h200["low"] * (1 - pct / 100))
    assert h100["high"] == pytest.approx(h200["high"] * (1 + pct / 100))
    assert f"widened by {pct:g} %" in out
    (line,) = [x for x in out.splitlines() if x.startswith("Cost model:")]
    assert line.endswith(
        "its band is the source's spread widened by the GEMM error, or by the end-to-end "
        "error of served runs where that is larger"
    )


def test_a_correction_switched_off_prices_the_run_without_it(capsys, tmp_path) -> None:
    """`--disable-correction drift`: another decode price, so another TPOT; the cost-model line
    and the saved result say what was off, and an unknown name is one line, exit 2."""
    base = ["--no-band", *SMALL, "--num-prompts", "20"]
    full = block_values(run_ok(capsys, *base))
    out = run_ok(capsys, *base, "--disable-correction", "drift", "--result-dir", str(tmp_path))
    (line,) = [x for x in out.splitlines() if x.startswith("Cost model:")]
    assert line.endswith("; corrections off: drift")
    assert block_values(out)["Mean TPOT (ms):"] != full["Mean TPOT (ms):"]
    (saved,) = tmp_path.glob("*.json")  # beside the Parquet records
    assert json.loads(saved.read_text())["disabled_corrections"] == ["drift"]
    assert main(["run", "--quiet", *base, "--disable-correction", "nope"]) == 2
    err = capsys.readouterr().err
    assert "'nope' is unknown" in err and err.count("\n") == 1


def _kv_capacity_blocks(capsys: pytest.CaptureFixture[str], *args: str) -> int:
    assert main(["kv-capacity", "--json", *args]) == 0
    return int(json.loads(capsys.readouterr().out)["num_gpu_blocks"])


def test_disabling_the_hybrid_manager_sizes_every_layer_as_full_attention(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gemma-2-9b (sliding and full layers): with --disable-hybrid-kv-cache-manager every layer
    keeps full KV in one group, so a block holds all 42 layers instead of one group's 21 and
    the pool has about half the blocks; each run's pool is kv-capacity's for the same flag,
    and the saved config says which one ran."""
    base = ["--no-band", *SMALL, "--num-prompts", "8", "--model", "gemma-2-9b"]
    blocks = {}
    for flag in ("--no-disable-hybrid-kv-cache-manager", "--disable-hybrid-kv-cache-manager"):
        run_ok(capsys, *base, flag, "--result-dir", str(tmp_path), "--result-filename", "r.json")
        doc = json.loads((tmp_path / "r.json").read_text())
        (tmp_path / "r.json").unlink()
        disabled = flag.startswith("--disable")
        assert doc["engine_config"]["disable_hybrid_kv_cache_manager"] is disabled
        assert doc["num_gpu_blocks"] == _kv_capacity_blocks(capsys, "--model", "gemma-2-9b", flag)
        blocks[disabled] = doc["num_gpu_blocks"]
    assert blocks[True] < blocks[False]
    assert blocks[True] == pytest.approx(blocks[False] / 2, rel=0.01)


def test_disabling_the_hybrid_manager_changes_nothing_on_a_dense_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama-2-7b has one attention kind: the flag is accepted (as vLLM) and the printed
    output, the per-step records and the saved metrics are the same bytes."""
    base = ["--no-band", *SMALL, "--num-prompts", "20", "--max-num-seqs", "8"]
    outs, docs = [], []
    for name, extra in (("on", []), ("off", ["--disable-hybrid-kv-cache-manager"])):
        rd = ["--result-dir", str(tmp_path), "--result-filename", f"{name}.json"]
        outs.append(run_ok(capsys, *base, *extra, *rd).replace(f"{name}.", "X."))
        docs.append(json.loads((tmp_path / f"{name}.json").read_text()))
    assert outs[0] == outs[1]
    assert (tmp_path / "on.steps.parquet").read_bytes() == (
        tmp_path / "off.steps.parquet"
    ).read_bytes()
    configs = [d.pop("engine_config") for d in docs]
    for d in docs:
        d.pop("date")
    assert docs[0] == docs[1]
    assert configs[1] == {**configs[0], "disable_hybrid_kv_cache_manager": True}
    assert _kv_capacity_blocks(capsys) == _kv_capacity_blocks(
        capsys, "--disable-hybrid-kv-cache-manager"
    )
