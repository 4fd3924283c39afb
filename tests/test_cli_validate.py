"""`pagesim validate --real`: a stored real run against the simulator, on any machine.

The stored report of a GPU call (`tests/fixtures/validation/`) is what this code makes of
that call's runs with the shipped profile; a run cut at its wall-clock limit is skipped with
a note, not compared."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pagesim.cli.app import main
from pagesim.data import calibration_dir
from pagesim.validate.report import REPEATS_HEADING
from pagesim.validate.store import read_json_file, read_real_run, real_run_files, write_json_file

ROOT = Path(__file__).resolve().parents[1]
# GPU calls kept as fixtures: real runs, their profiles and the reports made of them then.
STORED = ROOT / "tests" / "fixtures" / "validation"
REAL = STORED / "staged_inputs7" / "real" / "llama-2-7b"  # newest
PROFILE = calibration_dir() / "h200" / "llama-2-7b"
RUN = "chat-inf-bs16"


def _shipped_rows(run: str) -> dict[str, float]:
    doc = json.loads((STORED / "validation_llama-2-7b.json").read_text())
    entry = next(e for e in doc["runs"] if e["run"] == run)
    return {r["metric"]: r["error_pct"] for r in entry["rows"]}


def _validate(tmp_path: Path, *reals: Path) -> int:
    argv = [
        "validate",
        "--profile",
        str(PROFILE),
        "--output-dir",
        str(tmp_path / "out"),
        "--name",
        "v",
    ]
    for r in reals:
        argv += ["--real", str(r)]
    return main(argv)


def _truncated_copy(tmp_path: Path) -> Path:
    doc = read_json_file(REAL / f"{RUN}.json.xz")
    doc["result"]["truncated"] = True
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_stored_run_gives_the_shipped_reports_errors(tmp_path, capsys) -> None:
    assert _validate(tmp_path, REAL / f"{RUN}.json.xz") == 0
    doc = json.loads((tmp_path / "out" / "v.json").read_text())
    assert doc["num_runs"] == 1 and "skipped" not in doc
    got = {r["metric"]: r["error_pct"] for r in doc["runs"][0]["rows"]}
    assert got.keys() == _shipped_rows(RUN).keys()
    for metric, err in _shipped_rows(RUN).items():
        assert abs(got[metric] - err) < 1e-6, metric
    assert f"| {RUN} | llama-2-7b | 16 | inf |" in capsys.readouterr().out


def test_a_run_cut_at_its_wall_clock_limit_is_skipped_with_a_note(tmp_path, capsys) -> None:
    cut = _truncated_copy(tmp_path)
    assert _validate(tmp_path, cut, REAL / f"{RUN}.json.xz") == 0
    captured = capsys.readouterr()
    assert "skipped:" in captured.err and "wall-clock limit" in captured.err
    doc = json.loads((tmp_path / "out" / "v.json").read_text())
    assert [e["run"] for e in doc["runs"]] == [RUN]
    assert len(doc["skipped"]) == 1 and "cut.json" in doc["skipped"][0]
    assert "skipped:" in (tmp_path / "out" / "v.md").read_text()


def test_a_run_is_written_and_read_plain_gzip_or_xz(tmp_path) -> None:
    doc = read_json_file(REAL / f"{RUN}.json.xz")
    paths = [tmp_path / f"run{suffix}" for suffix in (".json", ".json.gz", ".json.xz")]
    for path in paths:
        write_json_file(path, doc)  # as save_real_run writes a run
    (tmp_path / "notes.txt").write_text("not a run")
    (tmp_path / "summary.json").write_text('{"device": {}}')  # a GPU call's other files
    assert real_run_files(tmp_path) == paths
    assert all(read_real_run(p) == doc for p in paths)
    assert gzip.decompress(paths[1].read_bytes()) == paths[0].read_bytes()
    again = tmp_path / "again.json.gz"
    write_json_file(again, doc)
    assert again.read_bytes() == paths[1].read_bytes()  # no timestamp in the gzip header


def test_only_cut_runs_or_a_bad_file_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    cut = _truncated_copy(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    bad_xz, bad_gz = tmp_path / "bad.json.xz", tmp_path / "bad.json.gz"
    bad_xz.write_bytes(b"not xz at all")
    bad_gz.write_bytes(b"not gzip at all")
    for reals, piece in (
        ((cut,), "was cut at its wall-clock limit (150 of 150"),
        ((cut, cut), "all 2 were cut"),
        ((bad,), "not valid JSON"),
        ((bad_xz,), "not valid JSON"),
        ((bad_gz,), "not valid JSON"),
        ((tmp_path / "none.json",), "no such file"),
    ):
        assert _validate(tmp_path, *reals) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and piece in err, err


@pytest.mark.parametrize("call, run", [("tp2", "chat-inf-bs16"), ("tp2_graphs", "chat-85pct-bs16")])
def test_the_tp2_reports_are_what_this_code_makes_of_their_runs(tmp_path, call, run) -> None:
    """`tests/fixtures/validation/tp2*/`: llama-3-70b at tensor parallel size 2 (eager, then with
    CUDA graphs), each run priced with its call's profile; the graph call's profile is the
    shipped default."""
    tp2 = STORED / call
    real = tp2 / "real" / "llama-3-70b-tp2" / f"{run}.json.xz"
    profile = tp2 / "profile" / "h200" / "llama-3-70b-tp2"
    argv = [
        "validate",
        "--real",
        str(real),
        "--profile",
        str(profile),
        "--output-dir",
        str(tmp_path),
        "--name",
        "v",
    ]
    assert main(argv) == 0
    got = json.loads((tmp_path / "v.json").read_text())["runs"][0]
    shipped = json.loads((tp2 / "validation_llama-3-70b-tp2.json").read_text())
    want = next(e for e in shipped["runs"] if e["run"] == run)
    assert got["model"] == "llama-3-70b" and got["load"] == want["load"]
    assert {r["metric"]: round(r["error_pct"], 6) for r in got["rows"]} == {
        r["metric"]: round(r["error_pct"], 6) for r in want["rows"]
    }
    if call == "tp2":
        assert [s for s in shipped["skipped"] if "chat-85pct" in s]  # cut at its wall clock
    else:
        assert all(r["met"] for e in shipped["runs"] for r in e["rows"])
        default = calibration_dir() / "h200" / "llama-3-70b-tp2"
        for f in profile.iterdir():
            assert (default / f.name).read_bytes() == f.read_bytes()


def test_a_saved_run_keeps_its_records_at_the_clocks_resolution(tmp_path) -> None:
    """Floats in the records are stored to 1 ns (the host clock's resolution); everything
    else, and every result key, as given."""
    from pagesim.config import EngineConfig
    from pagesim.validate.store import RECORD_DECIMALS, save_real_run

    assert RECORD_DECIMALS == 9
    records = {
        "itl_s": [[0.0069589123456789, 0.1234567891234]],
        "steps": {"wall_s": [1.00000000049, 2.5], "num_reqs": [3, 4], "cuda_graph": [True, False]},
        "sm_clock_mhz": [1980, 1845],
    }
    result = {"mean_tpot_ms": 6.958912345678912, "failed": 0}
    config = EngineConfig.create(model="tiny-llama", gpu="h200")
    path = save_real_run(
        tmp_path / "run.json.xz",
        config=config,
        load={"seed": 0},
        result=result,
        records=records,
        device={},
    )
    doc = read_real_run(path)
    assert doc["records"] == {
        "itl_s": [[0.006958912, 0.123456789]],
        "steps": {"wall_s": [1.0, 2.5], "num_reqs": [3, 4], "cuda_graph": [True, False]},
        "sm_clock_mhz": [1980, 1845],
    }
    assert doc["result"] == result


def _run_named(tmp_path: Path, runner: str) -> Path:
    doc = read_json_file(REAL / f"{RUN}.json.xz")
    doc["result"]["gpu_runner"] = runner  # as serve_workload names it from now on
    path = tmp_path / f"{RUN}.json"
    write_json_file(path, doc)
    return path


def test_a_profile_of_another_runner_mode_is_warned_about(tmp_path, capsys) -> None:
    """A run of the staged-input runner priced with a profile of the runner before it: one
    warning line on stderr and in the report, the comparison still made; no warning with a
    profile of its own mode, nor for runs that name no runner."""
    from pagesim.gpu.modes import RUNNER_MODES

    staged = _run_named(tmp_path, RUNNER_MODES[True])
    earlier = STORED / "rebuilt_inputs" / "profile" / "h200" / "llama-2-7b"
    assert (
        main(
            [
                "validate",
                "--real",
                str(staged),
                "--profile",
                str(earlier),
                "--output-dir",
                str(tmp_path / "out"),
                "--name",
                "v",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"warning: {RUN}: the run's runner (CUDA graphs, staged inputs) is not the "
        "one the profile measured (CUDA graphs, inputs rebuilt each step): its host "
        "time per step differs"
    ]
    assert err[0] in (tmp_path / "out" / "v.md").read_text()
    doc = json.loads((tmp_path / "out" / "v.json").read_text())
    assert doc["runs"][0]["runner_note"] and doc["num_runs"] == 1
    assert _validate(tmp_path, staged) == 0  # PROFILE: the shipped one, of the staged runner
    assert "warning" not in capsys.readouterr().err
    assert _validate(tmp_path, REAL / f"{RUN}.json.xz") == 0
    assert "warning" not in capsys.readouterr().err
    assert "runner_note" not in json.loads((tmp_path / "out" / "v.json").read_text())["runs"][0]


def test_the_runner_modes_name_the_stored_profiles() -> None:
    """The modes' short names cover the shipped and stored profiles of the two graph runners."""
    from pagesim.cost.profile import Profile
    from pagesim.gpu.modes import backend_description, profile_runner, runner_label

    assert profile_runner(backend_description(True)) is not None
    assert profile_runner("no runner named") is None
    labels = {
        runner_label(profile_runner(Profile.load(p).metadata.attention_backend))
        for p in (
            PROFILE,
            STORED / "rebuilt_inputs/profile/h200/llama-2-7b",
            STORED / "tp2/profile/h200/llama-3-70b-tp2",
        )
    }
    assert labels == {
        "CUDA graphs, inputs rebuilt each step",
        "CUDA graphs, staged inputs",
        "eager",
    }


def _run_and_repeat(tmp_path, doc: dict, metric: str, factor: float) -> tuple:
    """`doc` stored twice as a run and its repeat (`-r2`), the repeat's `metric` times
    `factor`; returns the two paths."""
    repeat = json.loads(json.dumps(doc))
    repeat["result"][metric] *= factor
    first, second = tmp_path / f"{RUN}.json", tmp_path / f"{RUN}-r2.json"
    write_json_file(first, doc)
    write_json_file(second, repeat)
    return first, second


def test_repeats_of_one_run_are_simulated_once_and_compared_by_their_mean(
    tmp_path, capsys, monkeypatch
) -> None:
    """Two stored runs of one traffic (the second 10 % slower per output token): one
    simulation prices both, and the repeats' table compares the prediction with their mean."""
    import pagesim.validate.compare as v

    doc = read_json_file(REAL / f"{RUN}.json.xz")
    first, second = _run_and_repeat(tmp_path, doc, "mean_tpot_ms", 1.1)
    calls = []
    simulate_like = v.simulate_like
    monkeypatch.setattr(
        v, "simulate_like", lambda *a, **k: calls.append(a) or simulate_like(*a, **k)
    )
    assert _validate(tmp_path, first, second, REAL / "chat-85pct-bs16.json.xz") == 0
    assert len(calls) == 2  # the two repeats, then chat-85pct-bs16
    report = json.loads((tmp_path / "out" / "v.json").read_text())
    assert [g["runs"] for g in report["repeat_groups"]] == [[RUN, f"{RUN}-r2"]]
    group = {r["metric"]: r for r in report["repeat_groups"][0]["rows"]}
    real_tpot = doc["result"]["mean_tpot_ms"]
    mean = real_tpot * 1.05
    tpot = group["mean_tpot_ms"]
    assert tpot["real"] == pytest.approx(mean)
    assert tpot["real_spread_pct"] == pytest.approx(100 * 0.1 / 1.05)
    predicted = report["runs"][0]["predicted"]["mean_tpot_ms"]
    assert tpot["error_pct"] == pytest.approx(100 * (predicted - mean) / mean)
    assert group["mean_ttft_ms"]["real_spread_pct"] == 0.0
    assert group["mean_ttft_ms"]["error_pct"] == pytest.approx(_shipped_rows(RUN)["mean_ttft_ms"])
    assert report["repeat_targets_checked"] == len(group)
    out = capsys.readouterr().out
    assert REPEATS_HEADING in out and f"| {RUN} | llama-2-7b | 16 | inf | 2 |" in out
    assert REPEATS_HEADING in (tmp_path / "out" / "v.md").read_text()


def test_runs_of_other_traffic_are_not_repeats(tmp_path) -> None:
    """A run served over another KV cache size is another traffic, whatever its name."""
    doc = read_json_file(REAL / f"{RUN}.json.xz")
    other = json.loads(json.dumps(doc))
    other["result"]["num_gpu_blocks"] -= 1000
    write_json_file(tmp_path / f"{RUN}-r2.json", other)
    assert _validate(tmp_path, REAL / f"{RUN}.json.xz", tmp_path / f"{RUN}-r2.json") == 0
    report = json.loads((tmp_path / "out" / "v.json").read_text())
    assert "repeat_groups" not in report and report["num_runs"] == 2


def test_repeat_targets_widen_to_half_the_repeats_spread() -> None:
    """Throughput, mean TPOT and mean E2E are held to max(3 %, half the real runs' spread);
    mean TTFT to 5 % and P99s to 10 % whatever the spread."""
    import pagesim.validate.compare as v

    spread = {m: 8.0 for m in v.REPEAT_TARGETS_PCT}
    spread["mean_e2el_ms"] = 4.0
    targets = v.repeat_targets(spread)
    assert targets["mean_tpot_ms"] == 4.0 and targets["request_throughput"] == 4.0
    assert targets["mean_e2el_ms"] == 3.0
    assert targets["mean_ttft_ms"] == 5.0 and targets["p99_tpot_ms"] == 10.0
    assert "median_tpot_ms" not in targets
    assert "mean_itl_ms" not in v.repeat_targets({"mean_tpot_ms": 1.0})


def test_repeats_report_says_which_targets_were_met(tmp_path) -> None:
    """The report counts the repeats' targets met against their mean and names the misses."""
    import pagesim.validate.compare as v
    from pagesim.validate.report import REPEATS_MET_HEADING

    first, second = _run_and_repeat(
        tmp_path, read_json_file(REAL / f"{RUN}.json.xz"), "p99_tpot_ms", 1.5
    )
    assert _validate(tmp_path, first, second) == 0
    report = json.loads((tmp_path / "out" / "v.json").read_text())
    rows = report["repeat_groups"][0]["rows"]
    assert {r["metric"] for r in rows} == set(v.REPEAT_TARGETS_PCT)
    met = sum(r["met"] for r in rows)
    assert report["repeat_targets_met"] == met and report["repeat_targets_checked"] == 8
    text = (tmp_path / "out" / "v.md").read_text()
    assert REPEATS_MET_HEADING in text and f"| all | | {met}/8 | |" in text
    tpot = next(r for r in rows if r["metric"] == "p99_tpot_ms")
    assert tpot["met"] == (abs(tpot["error_pct"]) <= 10.0)


def test_an_output_folder_that_cannot_be_made_is_one_line_before_simulating(capsys) -> None:
    argv = ["validate", "--real", str(REAL / f"{RUN}.json.xz"), "--output-dir", "/proc/nope"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "--output-dir /proc/nope" in err, err


def test_a_run_on_a_gpu_without_a_profile_is_priced_as_run_prices_it(tmp_path, capsys) -> None:
    """A run served on a GPU with no shipped profile is priced by transfer of the source
    GPU's profile, as `pagesim run --gpu` prices it (not by the analytical model), and the
    report says so."""
    from pagesim.sim.build import transfer_profile, transferred_cost_model
    from pagesim.sim.simulate import simulate
    from pagesim.validate.store import load_spec, real_run_config

    doc = read_json_file(REAL / f"{RUN}.json.xz")
    doc["engine_config"]["gpu"] = "h100-sxm"
    run = tmp_path / f"{RUN}.json"
    write_json_file(run, doc)
    argv = ["validate", "--real", str(run), "--output-dir", str(tmp_path / "out"), "--name", "v"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("Cost model: transfer of the shipped profile calibration/h200/llama-2-7b")
    entry = json.loads((tmp_path / "out" / "v.json").read_text())["runs"][0]
    config = real_run_config(doc)
    source = transfer_profile(config)
    assert source is not None and entry["profile"] == str(source)
    model = transferred_cost_model(config, source)
    want = simulate(config, load_spec(doc["load"]), cost_model=model).result
    assert entry["predicted"]["mean_tpot_ms"] == pytest.approx(want["mean_tpot_ms"], rel=1e-6)
    assert (tmp_path / "out" / "v.md").read_text().startswith(out.split("\n")[0])
    assert main(argv + ["--profile", str(PROFILE)]) == 2  # a profile of another GPU
    assert "the profile was measured on 'h200'" in capsys.readouterr().err
