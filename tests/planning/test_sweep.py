"""Sweeps: layout, determinism, failed points, resume, and local vs Ray backends."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from pagesim.errors import ConfigError
from pagesim.planning.grid import build_grid
from pagesim.planning.sweep import run_grid, run_sweep

BASE = {
    "workload": "random",
    "num_prompts": 24,
    "random_input_len": 96,
    "random_output_len": 24,
    "num_gpu_blocks_override": 64,
}


def small_grid():
    return build_grid({"block_size": [8, 16], "request_rate": [8.0, math.inf]}, base=BASE)


def files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_layout_and_summary(tmp_path: Path) -> None:
    res = run_sweep(small_grid(), num_runs=2, output_dir=tmp_path, timestamp="t1", n_jobs=1)
    d = tmp_path / "t1"
    assert res.directory == d
    assert (d / "sweep.json").is_file() and (d / "summary.csv").is_file()
    runs = sorted(str(p.relative_to(d)) for p in d.glob("*/run=*.json"))
    assert len(runs) == 8
    assert "ENGINE-block_size=8-LOAD-request_rate=inf/run=1.json" in runs
    doc = json.loads((d / "ENGINE-block_size=8-LOAD-request_rate=inf" / "run=1.json").read_text())
    assert doc["date"] == "t1" and doc["request_rate"] == "inf" and doc["seed"] == 1
    assert doc["sweep_params"]["block_size"] == 8 and doc["engine_config"]["block_size"] == 8
    summary = pd.read_csv(d / "summary.csv")
    assert list(summary.columns[:4]) == ["point", "run", "status", "error"]
    assert len(summary) == 8 and set(summary["status"]) == {"ok"}
    assert list(summary["run"]) == [0, 1] * 4
    row = summary[(summary["point"] == doc["sweep_point"]) & (summary["run"] == 1)].iloc[0]
    assert row["mean_ttft_ms"] == pytest.approx(doc["mean_ttft_ms"])
    assert row["seed"] == 1 and row["block_size"] == 8 and math.isinf(row["request_rate"])
    parquet = pd.read_parquet(d / "summary.parquet")
    assert list(parquet.columns) == list(summary.columns) and len(parquet) == 8


def test_same_seed_same_bytes_and_seeds_differ(tmp_path: Path) -> None:
    run_sweep(small_grid(), num_runs=2, output_dir=tmp_path / "a", timestamp="t", n_jobs=2)
    run_sweep(small_grid(), num_runs=2, output_dir=tmp_path / "b", timestamp="t", n_jobs=1)
    assert files(tmp_path / "a" / "t") == files(tmp_path / "b" / "t")
    s = pd.read_csv(tmp_path / "a" / "t" / "summary.csv")
    assert s.loc[0, "mean_ttft_ms"] != s.loc[1, "mean_ttft_ms"]  # run 1 uses seed + 1


def test_failed_point_is_reported_and_the_sweep_goes_on(tmp_path: Path, monkeypatch) -> None:
    # A run that fails only when simulated (a bad setting is refused by build_grid).
    import pagesim.planning.sweep as sweep

    def simulate(config, load, **kwargs):
        if config.block_size == 16:
            raise ConfigError("no run at block 16")
        return real(config, load, **kwargs)

    real = sweep.simulate
    monkeypatch.setattr(sweep, "simulate", simulate)
    grid = build_grid({"block_size": [8, 16]}, base=BASE)
    res = run_sweep(grid, output_dir=tmp_path, timestamp="t", n_jobs=1)
    assert [f["point"] for f in res.failures] == ["ENGINE-block_size=16"]
    assert res.failures[0]["settings"]["block_size"] == 16
    assert res.failures[0]["error"] == "ConfigError: no run at block 16"
    assert list(res.summary["status"]) == ["ok", "failed"]
    failed = tmp_path / "t" / "ENGINE-block_size=16" / "run=0.failed.json"
    assert json.loads(failed.read_text())["settings"]["block_size"] == 16
    assert (tmp_path / "t" / "ENGINE-block_size=8" / "run=0.json").is_file()


def test_resume_skips_done_runs_and_checks_the_grid(tmp_path: Path) -> None:
    first = run_sweep(small_grid(), output_dir=tmp_path, timestamp="t", n_jobs=1)
    victim = tmp_path / "t" / first.summary.loc[2, "point"] / "run=0.json"
    kept = tmp_path / "t" / first.summary.loc[0, "point"] / "run=0.json"
    before = victim.read_bytes()
    victim.unlink()
    kept.write_text(kept.read_text().replace('"completed"', '"completed" ', 1))
    marker = kept.read_bytes()
    again = run_sweep(small_grid(), output_dir=tmp_path, resume="t", n_jobs=1)
    assert again.num_skipped == 3
    assert victim.read_bytes() == before  # re-run, same bytes (the sweep's own date)
    assert kept.read_bytes() == marker  # not re-run
    with pytest.raises(ConfigError, match="grid differs"):
        run_sweep(build_grid({"block_size": [8]}, base=BASE), output_dir=tmp_path, resume="t")
    with pytest.raises(ConfigError, match="already holds a sweep"):
        run_sweep(small_grid(), output_dir=tmp_path, timestamp="t")
    with pytest.raises(ConfigError, match="no sweep.json"):
        run_sweep(small_grid(), output_dir=tmp_path, resume="nothing-here")


def test_save_records_and_in_memory_grid(tmp_path: Path) -> None:
    grid = build_grid({"block_size": [16]}, base=BASE)
    run_sweep(grid, output_dir=tmp_path, timestamp="t", save_records=True, n_jobs=1)
    steps = pd.read_parquet(tmp_path / "t" / "default" / "run=0.steps.parquet")
    reqs = pd.read_parquet(tmp_path / "t" / "default" / "run=0.requests.parquet")
    assert len(reqs) == 24 and "kv_usage" in steps
    mem = run_grid(grid)
    disk = pd.read_csv(tmp_path / "t" / "summary.csv")
    assert mem.loc[0, "mean_ttft_ms"] == pytest.approx(disk.loc[0, "mean_ttft_ms"], rel=1e-12)


@pytest.mark.slow
def test_ray_backend_gives_the_local_results(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="ray is not installed (pip install 'pagesim[ray]')")
    grid = small_grid()
    run_sweep(grid, output_dir=tmp_path / "local", timestamp="t", n_jobs=2)
    run_sweep(grid, output_dir=tmp_path / "ray", timestamp="t", backend="ray", n_jobs=2)
    assert files(tmp_path / "local" / "t") == files(tmp_path / "ray" / "t")


def test_unknown_backend(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--backend 'dask'"):
        run_sweep(small_grid(), output_dir=tmp_path, backend="dask")
    assert not any(tmp_path.iterdir())  # nothing written


def test_resume_redoes_a_torn_run_file(tmp_path: Path) -> None:
    """A run file cut short (a crash mid-write before writes were atomic, a full disk) does
    not count as done: --resume runs it again, to the same bytes."""
    first = run_sweep(small_grid(), output_dir=tmp_path, timestamp="t", n_jobs=1)
    torn = tmp_path / "t" / first.summary.loc[1, "point"] / "run=0.json"
    whole = torn.read_bytes()
    torn.write_bytes(whole[:100])
    again = run_sweep(small_grid(), output_dir=tmp_path, resume="t", n_jobs=1)
    assert again.num_skipped == 3
    assert torn.read_bytes() == whole


def test_an_interrupted_sweep_keeps_its_runs_and_says_how_to_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from pagesim.cli.app import main
    from pagesim.planning import sweep as sweep_module

    real_execute = sweep_module.execute

    def interrupted(fn, tasks, **kw):  # one run finishes, then Ctrl-C
        for i, outcome in real_execute(fn, tasks, **kw):
            yield i, outcome
            raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "execute", interrupted)
    argv = ["sweep", "--quiet", "--workload", "random", "--num-prompts", "8"]
    argv += ["--block-size", "8,16", "--jobs", "1", "--output-dir", str(tmp_path)]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert "interrupted: 1 of 2 runs done" in err and "--resume" in err
    (directory,) = tmp_path.iterdir()
    monkeypatch.setattr(sweep_module, "execute", real_execute)
    assert main([*argv, "--resume", str(directory)]) == 0
    assert "1 run, 1 already done" in capsys.readouterr().out


def test_a_gpu_without_a_profile_is_priced_as_run_prices_it(tmp_path: Path) -> None:
    """No profile ships for the H100: its points are priced by transfer of the H200's, as
    `pagesim run --gpu h100-sxm` prices them, unless the point asks for `analytical`."""
    base = {**BASE, "model": "llama-2-7b", "gpu": "h100-sxm", "block_size": 16}
    grid = build_grid({"request_rate": [math.inf]}, base=base)
    run_sweep(grid, output_dir=tmp_path / "t", timestamp="t", n_jobs=1)
    by_name = build_grid({"profile": ["analytical"], "request_rate": [math.inf]}, base=base)
    run_sweep(by_name, output_dir=tmp_path / "a", timestamp="a", n_jobs=1)
    (moved,) = (tmp_path / "t" / "t").glob("*/run=0.json")
    (kept,) = (tmp_path / "a" / "a").glob("*/run=0.json")
    moved_doc, kept_doc = json.loads(moved.read_text()), json.loads(kept.read_text())
    assert moved_doc["cost_model"] == "transfer"
    assert moved_doc["profile"]["name"] == "h200/llama-2-7b"  # the source it carries over
    assert kept_doc["cost_model"] == "analytical" and kept_doc["profile"] is None
    assert moved_doc["mean_tpot_ms"] != kept_doc["mean_tpot_ms"]
    summary = pd.read_csv(tmp_path / "t" / "t" / "summary.csv").iloc[0]
    assert (summary["cost_model"], summary["profile"]) == (
        "transfer",
        "calibration/h200/llama-2-7b",
    )
