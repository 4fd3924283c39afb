"""`pagesim fit-report`: the held-out fit error of a profile, and bad input as one line."""

from __future__ import annotations

from pagesim.cli.app import main
from pagesim.cost.fit import fit_report
from pagesim.cost.profile import Profile
from pagesim.sim.build import CALIBRATION_DIR


def test_prints_the_profiles_held_out_report(capsys) -> None:
    assert main(["fit-report", "--model", "llama-3-8b", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    expected = fit_report(Profile.load(CALIBRATION_DIR / "h200" / "llama-3-8b"), seed=3)
    assert expected.to_markdown() in out
    assert "block 16:" in out and "at 8,192" in out


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path) -> None:
    for argv, piece in ([["--profile", str(tmp_path)], "no such calibration profile"],
                        [["--model", "nosuch"], "unknown model"],
                        [["--model", "tiny-llama"], "no shipped H200 profile"],
                        [["--holdout-fraction", "1.5"], "holdout_fraction=1.5"]):
        assert main(["fit-report", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and piece in err, err
