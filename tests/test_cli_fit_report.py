"""`pagesim fit-report`: the held-out fit error of a profile, and bad input as one line."""

from __future__ import annotations

import types

import pytest

from pagesim.cli.app import main
from pagesim.cost.fit import contributions_markdown, correction_contributions, fit_report
from pagesim.cost.profile import Profile
from pagesim.data import calibration_dir


def test_prints_the_profiles_held_out_report(capsys) -> None:
    assert main(["fit-report", "--model", "llama-3-8b", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    expected = fit_report(Profile.load(calibration_dir() / "h200" / "llama-3-8b"), seed=3)
    assert expected.to_markdown() in out
    assert "block 16:" in out and "at 8,192" in out
    profile = Profile.load(calibration_dir() / "h200" / "llama-3-8b")
    assert contributions_markdown(correction_contributions(profile, seed=3)) in out


def test_a_disabled_correction_is_left_off_in_the_first_table(capsys) -> None:
    assert main(["fit-report", "--disable-correction", "reread", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    profile = Profile.load(calibration_dir() / "h200" / "llama-2-7b")
    off = fit_report(profile, seed=2, disabled_corrections=("reread",))
    assert "corrections off: reread" in out and off.to_markdown() in out
    assert off != fit_report(profile, seed=2)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path) -> None:
    for argv, piece in (
        [["--profile", str(tmp_path)], "no such calibration profile"],
        [["--model", "nosuch"], "unknown model"],
        [["--model", "tiny-llama"], "no shipped H200 profile"],
        [["--holdout-fraction", "1.5"], "holdout_fraction=1.5"],
        [["--disable-correction", "nope"], "correction 'nope' is unknown"],
    ):
        assert main(["fit-report", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and piece in err, err


def test_calibrate_ends_with_the_new_profiles_fit_report(capsys, monkeypatch) -> None:
    """The GPU half replaced by the shipped profile: what `pagesim calibrate` prints after it."""
    pytest.importorskip("torch")
    import pagesim.gpu.device as device
    import pagesim.gpu.profiler as profiler

    shipped = calibration_dir() / "h200" / "llama-2-7b"
    monkeypatch.setattr(device, "require_cuda", lambda *hint: None)
    monkeypatch.setattr(
        profiler,
        "run_calibration",
        lambda *a, **k: types.SimpleNamespace(
            profile=Profile.load(shipped), directory=shipped, elapsed_s=1.0
        ),
    )
    assert main(["calibrate", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert fit_report(Profile.load(shipped)).to_markdown() in out


def test_calibrate_decode_batches_reach_the_grid_and_bad_ones_are_one_line(
    capsys, monkeypatch
) -> None:
    pytest.importorskip("torch")
    import pagesim.gpu.device as device
    import pagesim.gpu.profiler as profiler
    from pagesim.cli.calibrate import DEFAULT_DECODE_BATCHES
    from pagesim.gpu.calibrate import CalibrationGrid

    assert DEFAULT_DECODE_BATCHES == CalibrationGrid().decode_batches
    monkeypatch.setattr(device, "require_cuda", lambda *hint: None)
    assert main(["calibrate", "--decode-batches", "1,x"]) == 2  # before the GPU is touched
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--decode-batches" in err, err
    shipped = calibration_dir() / "h200" / "llama-2-7b"
    grids = []

    def fake(config, grid, **kwargs):
        grids.append(grid)
        return types.SimpleNamespace(
            profile=Profile.load(shipped), directory=shipped, elapsed_s=1.0
        )

    monkeypatch.setattr(device, "require_cuda", lambda *hint: None)
    monkeypatch.setattr(profiler, "run_calibration", fake)
    assert main(["calibrate", "--quiet", "--decode-batches", "24,1,8,24,16"]) == 0
    assert grids[0].decode_batches == (1, 8, 16, 24)
    # by default every block size is measured, and every one with the full grid
    assert grids[0].block_sizes == (8, 16, 32, 64, 128) == grids[0].full_block_sizes
    assert CalibrationGrid().full_block_sizes == CalibrationGrid().block_sizes


def test_calibrate_refuses_an_output_folder_it_cannot_make_before_the_gpu(
    capsys, monkeypatch
) -> None:
    pytest.importorskip("torch")
    import pagesim.gpu.device as device
    import pagesim.gpu.profiler as profiler

    def measured(*a, **k):
        raise AssertionError("calibrated before the folder was made")

    monkeypatch.setattr(device, "require_cuda", lambda *hint: None)
    monkeypatch.setattr(profiler, "run_calibration", measured)
    assert main(["calibrate", "--quiet", "--output-dir", "/proc/nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--output-dir /proc/nope" in err, err
