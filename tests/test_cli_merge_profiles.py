"""`pagesim merge-profiles`: writes the median profile, reports each source's distance from
it, and answers bad input with one line and exit 2."""

from __future__ import annotations

import dataclasses

from pagesim.cli.app import main
from pagesim.cost.profile import Profile
from pagesim.cost.profile_merge import merge_profiles
from tests.cost.synthetic_profile import make_synthetic_profile


def _sources(tmp_path, seeds=(1, 2, 3)) -> list[str]:
    return [str(make_synthetic_profile(seed=s).save(tmp_path / f"s{s}")) for s in seeds]


def test_writes_the_median_profile_and_each_sources_distance(capsys, tmp_path) -> None:
    sources = _sources(tmp_path)
    out = tmp_path / "merged"
    assert main(["merge-profiles", *sources, "--output-dir", str(out)]) == 0
    assert Profile.load(out) == merge_profiles([Profile.load(s) for s in sources])
    text = capsys.readouterr().out
    assert "median of 3 calibrations" in text
    assert all(f"{s} (2026-01-01): " in text for s in sources)


def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path) -> None:
    a, b = _sources(tmp_path, (1, 2))
    other = make_synthetic_profile(seed=3)
    other = Profile(
        dataclasses.replace(other.metadata, torch="9.9"),
        other.decode,
        other.prefill,
        other.mixed,
        other.overhead,
    ).save(tmp_path / "other")
    for argv, piece in (
        [[a, "-o", a], "is one of the sources"],
        [[a, str(tmp_path / "nosuch"), "-o", str(tmp_path / "x")], "no such calibration profile"],
        [[a, str(other), "-o", str(tmp_path / "y")], "differ in torch"],
        [[a, b], "--output-dir"],
        [[a, b, "-o", "/proc/nope"], "--output-dir /proc/nope"],  # mkdir refuses it
    ):
        assert main(["merge-profiles", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and piece in err, err
    assert not (tmp_path / "y").exists()
