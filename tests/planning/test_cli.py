"""`pagesim sweep`, `pagesim plan`, `pagesim plot`: outputs, files and exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pagesim.cli.app import main

SMALL = [
    "--workload",
    "random",
    "--random-input-len",
    "96",
    "--random-output-len",
    "24",
    "--num-prompts",
    "20",
    "--num-gpu-blocks-override",
    "64",
]


def test_sweep_dry_run_writes_nothing(tmp_path: Path, capsys) -> None:
    rc = main(
        [
            "sweep",
            *SMALL,
            "--block-size",
            "8,16",
            "--request-rate",
            "2,4,8",
            "--dry-run",
            "-o",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[0] == "6 points x 1 runs = 6 simulations"
    assert "ENGINE-block_size=16-LOAD-request_rate=8" in out
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, words",
    [
        (["--block-size", "8,abc"], "block_size='abc': expected an integer"),
        (["--block-size", "0,16"], "sweep point ENGINE-block_size=0"),
        (["--allocator", "paged,slab"], "allocator='slab'"),
        (["--workload", "chat,nope"], "workload 'nope'"),
        (["--backend", "dask"], "--backend 'dask'"),
        (["--engine-params", "missing.json"], "cannot read"),
        # sized as `pagesim run` sizes it, before any run starts
        (["--model", "llama-2-7b,llama-2-70b"], "point ENGINE-model=llama-2-70b: weights of"),
        (["--gpu-memory-utilization", "0.9,0.097"], "leave no KV cache memory"),
    ],
)
def test_bad_grids_exit_2_with_one_line(tmp_path: Path, capsys, args, words) -> None:
    rc = main(["sweep", *args, "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert words in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing ran


def test_sweep_then_plot(tmp_path: Path, capsys) -> None:
    params = tmp_path / "bench.json"
    params.write_text(json.dumps([{"request_rate": 4}, {"request_rate": 16}]))
    rc = main(
        [
            "sweep",
            *SMALL,
            "--block-size",
            "8,16",
            "--bench-params",
            str(params),
            "-o",
            str(tmp_path / "res"),
            "--quiet",
            "--jobs",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "4 points x 1 runs: 4 run, 0 already done, 0 failed, 0 with rejected requests" in out
    (sweep_dir,) = (tmp_path / "res").iterdir()
    assert (sweep_dir / "summary.csv").is_file()
    rc = main(
        [
            "sweep",
            *SMALL,
            "--block-size",
            "8,16",
            "--bench-params",
            str(params),
            "-o",
            str(tmp_path / "res"),
            "--resume",
            sweep_dir.name,
            "--quiet",
        ]
    )
    assert rc == 0 and "0 run, 4 already done" in capsys.readouterr().out
    rc = main(["plot", str(sweep_dir), "--format", "png"])
    out = capsys.readouterr().out
    assert rc == 0
    for kind in ("latency", "block-size", "pareto"):
        assert (sweep_dir / "plots" / f"{kind}.png").is_file(), out
    # nothing preempted: no figure of zeros, one line saying why
    assert not (sweep_dir / "plots" / "preemption.png").exists()
    assert "No preemption.png: no run preempted a request" in out
    assert not (sweep_dir / "plots" / "waste.png").exists()  # allocator did not vary
    assert main(["plot", str(sweep_dir), "--kind", "bogus"]) == 2
    assert main(["plot", str(tmp_path)]) == 2


def test_failed_runs_exit_1_and_are_listed(tmp_path: Path, capsys, monkeypatch) -> None:
    # A run that fails only when simulated (every bad setting is refused before the runs).
    import pagesim.planning.sweep as sweep

    def simulate(config, load, **kwargs):
        if config.block_size == 16:
            raise RuntimeError("no run at block 16\nsecond line")
        return real(config, load, **kwargs)

    real = sweep.simulate
    monkeypatch.setattr(sweep, "simulate", simulate)
    rc = main(
        [
            "sweep",
            "--workload",
            "random",
            "--num-prompts",
            "10",
            "--random-input-len",
            "64",
            "--random-output-len",
            "8",
            "--block-size",
            "8,16",
            "-o",
            str(tmp_path),
            "--quiet",
            "--jobs",
            "1",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 1
    assert "1 failed" in captured.out
    (line,) = [x for x in captured.err.splitlines() if x.startswith("failed:")]
    assert "ENGINE-block_size=16 run=0 (" in line and "block_size=16" in line
    assert line.endswith("RuntimeError: no run at block 16")


UNMAKEABLE = "/proc/nope"  # passes every check (as root), yet mkdir refuses it


@pytest.mark.parametrize(
    "argv, words",
    [
        (["sweep", *SMALL, "--quiet", "-o", UNMAKEABLE], f"--output-dir {UNMAKEABLE}"),
        (["plot", "SWEEP", "--output-dir", UNMAKEABLE], f"--output-dir {UNMAKEABLE}"),
        (
            ["plan", *SMALL, "--slo", "p99_ttft_ms<=500", "--save-result", f"{UNMAKEABLE}/p.json"],
            f"--save-result {UNMAKEABLE}/p.json",
        ),
    ],
    ids=["sweep", "plot", "plan"],
)
def test_an_output_folder_that_cannot_be_made_is_one_line(
    tmp_path: Path, capsys, argv, words
) -> None:
    (tmp_path / "summary.csv").write_text("point,run,status\ndefault,0,ok\n")
    rc = main([str(tmp_path) if a == "SWEEP" else a for a in argv])
    out, err = capsys.readouterr()
    assert rc == 2 and words in err and err.count("\n") == 1, err
    assert "Plan for" not in out  # refused before the search


@pytest.mark.parametrize(
    "args, words",
    [
        (["--slo", "p99_ttft_ms<=fast"], "expected KEY<=VALUE"),
        (["--slo", "p99_latency<=5"], "unknown metric 'p99_latency'"),
        ([], "give at least one objective"),
        (["--slo", "ttft:500", "--kv-sizing"], "--kv-sizing needs --target-rate"),
        (["--slo", "ttft:500", "--target-rate", "5", "--router", "random"], "unknown router"),
        (["--slo", "ttft:500", "--target-rate", "1e18"], "1e+18: too large"),
        (
            ["--slo", "ttft:500", "--target-rate", "166667", "--min-duration", "60"],
            "at most 166,666 req/s",
        ),
        (
            ["--slo", "ttft:500", "--target-rate", "1e308", "--min-duration", "0"],
            "at most 10,000,000 req/s",
        ),
    ],
)
def test_bad_plans_exit_2(capsys, args, words) -> None:
    rc = main(["plan", *args])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1


def test_plan_reports_rate_and_replicas(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    rc = main(
        [
            "plan",
            "--workload",
            "random",
            "--random-input-len",
            "512",
            "--random-output-len",
            "64",
            "--num-prompts",
            "40",
            "--max-num-seqs",
            "16",
            "--max-num-batched-tokens",
            "2048",
            "--slo",
            "p99_ttft_ms<=400",
            "--min-duration",
            "5",
            "--rel-tol",
            "0.1",
            "--target-rate",
            "60",
            "--save-result",
            str(out_file),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out_file.read_text())
    rate = doc["capacity"]["max_rate"]
    assert re.search(rf"^Rate found within SLOs \(offered\): +{rate:.3f} req/s", out, re.M)
    got = doc["capacity"]["result"]["request_throughput"]
    assert re.search(rf"^Throughput achieved at it: +{got:.3f} req/s", out, re.M)
    sat = doc["capacity"]["saturated_throughput"]
    assert re.search(rf"^Saturated capacity: +{sat:.3f} req/s \(40 requests", out, re.M)
    assert doc["capacity"]["binding_slo"].startswith("p99_ttft_ms<=400 (")
    assert f"Binding SLO:{' ' * 25}{doc['capacity']['binding_slo']}" in out
    assert doc["capacity"]["result"]["p99_ttft_ms"] <= 400
    n = doc["replicas"]["num_replicas"]
    assert f"Replicas needed: {n} ({n} GPUs)" in out and n >= 2


def test_config_file_lists_are_axes(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("workload: random\nnum_prompts: 10\nblock-size: [8, 16]\nrequest_rate: 4\n")
    rc = main(["sweep", "--config", str(cfg), "--request-rate", "2,8", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith("4 points")  # the flag's list wins over the file's 4
    assert "ENGINE-block_size=16-LOAD-request_rate=8" in out
    cfg.write_text("block_size: [8, x]\n")
    assert main(["sweep", "--config", str(cfg), "--dry-run"]) == 2
    assert "block_size='x': expected an integer" in capsys.readouterr().err


def test_compare_tp_plans_each_size_and_picks_the_fewest_gpus(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    rc = main(
        [
            "plan",
            "--model",
            "llama-3-70b",
            "--gpu",
            "h200",
            "--slo",
            "p99_ttft_ms<=3000",
            "--slo",
            "p99_tpot_ms<=100",
            "--num-prompts",
            "40",
            "--min-duration",
            "5",
            "--rel-tol",
            "0.2",
            "--target-rate",
            "6",
            "--compare-tp",
            "4,1,2",
            "--save-result",
            str(out_file),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out_file.read_text())
    entries = {e["tp"]: e for e in doc["compare_tp"]}
    assert list(entries) == [1, 2, 4]  # in order of size
    assert "do not fit" in entries[1]["error"]  # 141 GB of weights on one H200
    gpus = {
        tp: e["replicas"]["num_replicas"] * tp
        for tp, e in entries.items()
        if (e.get("replicas") or {}).get("num_replicas")
    }
    assert gpus and doc["best"]["gpus"] == min(gpus.values())
    assert (
        f"Fewest GPUs for 6 req/s: tensor_parallel_size {doc['best']['tp']} x "
        f"{doc['best']['num_replicas']} replicas = {doc['best']['gpus']} GPUs"
    ) in out
    assert "=== tensor_parallel_size 2 ===" in out
    # TP 2 has a shipped H200 profile, TP 4 has none: the table says so, and warns
    assert entries[2]["cost_model"].endswith("calibration/h200/llama-3-70b-tp2")
    assert entries[4]["cost_model"] == "analytical"
    assert "Note: the sizes are priced by different cost models" in out


def test_compare_tp_analytical_prices_every_size_alike(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    rc = main(
        [
            "plan",
            "--model",
            "llama-3-70b",
            "--gpu",
            "h200",
            "--slo",
            "p99_tpot_ms<=100",
            "--num-prompts",
            "40",
            "--min-duration",
            "5",
            "--rel-tol",
            "0.3",
            "--compare-tp",
            "2,4",
            "--analytical",
            "--save-result",
            str(out_file),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    doc = json.loads(out_file.read_text())
    assert [e["cost_model"] for e in doc["compare_tp"]] == ["analytical", "analytical"]
    assert "Cost model: analytical\n" in out and "different cost models" not in out


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--compare-tp", "2,x"], "expected a comma list of integers"),
        (["--compare-tp", "0,2"], "give distinct sizes >= 1"),
        (["--compare-tp", "2,2"], "give distinct sizes >= 1"),
        (["--compare-tp", "2,4", "--tensor-parallel-size", "2"], "drop --tensor-parallel-size"),
        (["--compare-tp", "2,4", "--profile", "calibration/h200/llama-3-8b"], "drop --profile"),
        (["--compare-tp", "2,4", "--kv-sizing", "--target-rate", "3"], "drop --kv-sizing"),
        (["--compare-tp", "1,3"], "no size can be built: weights of llama-3-70b"),
        (["--analytical", "--profile", "calibration/h200/llama-3-8b"], "drop --profile"),
    ],
)
def test_compare_tp_bad_input_is_one_line(capsys, extra, words) -> None:
    rc = main(["plan", "--model", "llama-3-70b", "--slo", "ttft:500", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and words in err and err.count("\n") == 1, err


def test_plan_with_slower_steps_has_proportionally_less_capacity(tmp_path: Path, capsys) -> None:
    """Every step 1.25 times as long: the saturated throughput (all requests at t=0, one
    schedule) falls by that factor, and the saved plan records the factor."""
    base = [*SMALL, "--slo", "p99_tpot_ms<=1000", "--min-duration", "1", "--analytical"]
    docs = []
    for extra in ([], ["--step-time-scale", "1.25"]):
        path = tmp_path / f"plan{len(docs)}.json"
        assert main(["plan", *base, *extra, "--save-result", str(path)]) == 0
        out = capsys.readouterr().out
        docs.append(json.loads(path.read_text()))
    assert "Cost model: analytical; every step x 1.25" in out
    fast, slow = (d["capacity"]["saturated_throughput"] for d in docs)
    assert slow == pytest.approx(fast / 1.25, rel=1e-6)
    assert docs[1]["step_time_scale"] == 1.25 and "step_time_scale" not in docs[0]


def test_kv_sizing_prints_a_run_command_that_serves_its_load(capsys) -> None:
    import shlex

    args = ["plan", "--workload", "random", "--random-input-len", "512"]
    args += ["--random-output-len", "64", "--num-prompts", "40", "--max-num-seqs", "16"]
    args += ["--slo", "p99_ttft_ms<=400", "--min-duration", "5", "--rel-tol", "0.1"]
    assert main([*args, "--target-rate", "10", "--kv-sizing"]) == 0
    out = capsys.readouterr().out
    blocks = int(re.search(r"Smallest KV cache at 10 req/s: (\d+) blocks", out).group(1))
    (command,) = [x.removeprefix("Check it: ") for x in out.splitlines() if x.startswith("Check")]
    assert "--random-input-len 512" in command and "--max-num-seqs 16" in command
    argv = shlex.split(command)
    assert argv[:2] == ["pagesim", "run"]
    assert main([*argv[1:], "--quiet"]) == 0
    run = capsys.readouterr().out
    assert re.search(rf"GPU KV cache blocks: +{blocks}\b", run)
    assert float(re.search(r"P99 TTFT \(ms\): +([0-9.]+)", run).group(1)) <= 400


def test_a_plan_reports_the_rate_across_the_profiles_spread(tmp_path: Path, capsys) -> None:
    out_file = tmp_path / "plan.json"
    args = ["--workload", "random", "--random-input-len", "256", "--random-output-len", "32"]
    args += ["--num-prompts", "60", "--min-duration", "5", "--slo", "p99_tpot_ms<=30"]
    assert main(["plan", *args, "--save-result", str(out_file)]) == 0
    out = capsys.readouterr().out
    cap = json.loads(out_file.read_text())["capacity"]
    low, high = cap["band"]["max_rate"]
    assert low <= cap["max_rate"] <= high and low < high
    assert cap["band"]["low"] < 1 < cap["band"]["high"]
    assert f"Rate within SLOs: {cap['max_rate']:.3f} req/s ({low:.3f}-{high:.3f} across " in out
    assert main(["plan", *args, "--no-band", "--save-result", str(out_file)]) == 0
    assert "Rate within SLOs" not in capsys.readouterr().out
    assert "band" not in json.loads(out_file.read_text())["capacity"]


def test_a_plan_prices_with_a_correction_switched_off(tmp_path: Path, capsys) -> None:
    """`pagesim plan --disable-correction drift`: the saturated throughput moves with the
    decode price, the saved plan names what was off; the analytical model has none to drop,
    and an unknown name is one line before any output."""
    base = [*SMALL, "--slo", "p99_tpot_ms<=1000", "--min-duration", "1", "--no-band"]
    docs = []
    for extra in ([], ["--disable-correction", "drift"]):
        path = tmp_path / f"plan{len(docs)}.json"
        assert main(["plan", *base, *extra, "--save-result", str(path)]) == 0
        out = capsys.readouterr().out
        docs.append(json.loads(path.read_text()))
    assert "; corrections off: drift" in out
    full, off = (d["capacity"]["saturated_throughput"] for d in docs)
    assert off != full
    assert docs[1]["disabled_corrections"] == ["drift"] and "disabled_corrections" not in docs[0]
    assert main(["plan", *base, "--analytical", "--disable-correction", "drift"]) == 2
    assert "no corrections" in capsys.readouterr().err
    assert main(["plan", *base, "--disable-correction", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "'nope' is unknown" in err and err.count("\n") == 1


def test_compare_tp_summary_names_the_winner_or_says_none_fits(capsys) -> None:
    from pagesim.cli.plan import _best

    failed = {"tp": 1, "error": "weights do not fit"}
    priced = {"tp": 2, "cost_model": "analytical", "capacity": {"max_rate": 3.0}}
    assert _best([failed], None) is None
    assert "No TP size meets the SLOs\n" in capsys.readouterr().out
    assert _best([failed, priced], 6.0) is None  # a rate, but no replica count meets 6 req/s
    assert "No TP size meets the SLOs at 6 req/s\n" in capsys.readouterr().out
    best = _best([failed, priced], None)
    assert best is not None and best["tp"] == 2
    assert "Most req/s per GPU: tensor_parallel_size 2 (1.500 req/s per GPU)\n" in (
        capsys.readouterr().out
    )


def test_sweep_serves_gemma_without_the_hybrid_manager_when_told(tmp_path: Path, capsys) -> None:
    """The switch is an engine setting of every point: gemma-2-9b's runs are sized as
    kv-capacity sizes the same flag, and a dense model's point runs as without it."""
    small = [s for s in SMALL if s not in ("--num-gpu-blocks-override", "64")]
    rc = main(
        [
            "sweep",
            *small,
            "--num-prompts",
            "6",
            "--model",
            "gemma-2-9b,llama-2-7b",
            "--disable-hybrid-kv-cache-manager",
            "-o",
            str(tmp_path),
            "--quiet",
            "--jobs",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    (sweep_dir,) = tmp_path.iterdir()
    docs = {}
    for path in sweep_dir.rglob("*.json"):
        doc = json.loads(path.read_text())
        if "engine_config" in doc:
            docs[doc["engine_config"]["model"]] = doc
    assert set(docs) == {"gemma-2-9b", "llama-2-7b"}
    for model, doc in docs.items():
        assert doc["engine_config"]["disable_hybrid_kv_cache_manager"] is True
        for flags in (["--disable-hybrid-kv-cache-manager"], []):
            assert main(["kv-capacity", "--json", "--model", model, *flags]) == 0
            want = json.loads(capsys.readouterr().out)["num_gpu_blocks"]
            assert (doc["num_gpu_blocks"] == want) is (bool(flags) or model == "llama-2-7b")


def test_plan_serves_gemma_without_the_hybrid_manager_when_told(capsys) -> None:
    """`plan --kv-sizing` searches the pool that the flag gives (every layer full attention,
    about half the blocks) and its `Check it` command carries the flag."""
    from pagesim.config import EngineConfig
    from pagesim.kvcache.sizing import kv_capacity

    args = ["plan", "--model", "gemma-2-9b", "--workload", "random", "--random-input-len", "512"]
    args += ["--random-output-len", "64", "--num-prompts", "40", "--max-num-seqs", "16"]
    args += ["--slo", "p99_ttft_ms<=400", "--min-duration", "5", "--rel-tol", "0.1"]
    args += ["--target-rate", "2", "--kv-sizing"]
    largest = {}
    for disabled in (False, True):
        assert main([*args, *(["--disable-hybrid-kv-cache-manager"] if disabled else [])]) == 0
        out = capsys.readouterr().out
        largest[disabled] = int(re.search(r"^ +(\d+) blocks", out, re.M).group(1))
        full = EngineConfig.create(
            model="gemma-2-9b",
            max_num_seqs=16,
            gpu_memory_utilization=1.0,
            disable_hybrid_kv_cache_manager=disabled,
        )
        assert largest[disabled] == kv_capacity(full).num_gpu_blocks
        (command,) = [x for x in out.splitlines() if x.startswith("Check it: ")]
        assert ("--disable-hybrid-kv-cache-manager" in command.split()) is disabled
    assert largest[True] == pytest.approx(largest[False] / 2, rel=0.01)
