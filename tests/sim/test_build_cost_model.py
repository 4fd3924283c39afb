"""`build_cost_model`: a calibrated model is fitted once per profile's files and engine."""

from __future__ import annotations

import os
import shutil

import pytest

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.errors import ConfigError
from pagesim.sim.build import build_cost_model, default_profile


def test_one_fit_per_profile_files_and_engine(tmp_path) -> None:
    config = EngineConfig.create(model="llama-2-7b", gpu="h200")
    shipped = default_profile(config)
    assert shipped is not None
    profile = tmp_path / "profile"
    shutil.copytree(shipped, profile)
    first = build_cost_model(config, profile)
    assert build_cost_model(config, str(profile)) is first  # same files: the same fit
    assert build_cost_model(config.replace(block_size=32), profile) is first  # same specs
    table = profile / "decode.csv"
    stat = table.stat()
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    refit = build_cost_model(config, profile)  # a file changed on disk: fitted again
    assert refit is not first
    shape = BatchShape.mixed(300, 1024, 32, 900, 16)
    assert refit.step_time(shape) == first.step_time(shape)  # same contents, same prices
    assert isinstance(build_cost_model(config, None), AnalyticalCostModel)


def test_a_profile_of_another_model_is_refused_every_time(tmp_path) -> None:
    config = EngineConfig.create(model="llama-3-8b", gpu="h200")
    other = default_profile(EngineConfig.create(model="llama-2-7b", gpu="h200"))
    for _ in range(2):  # a refusal is not cached as a model
        with pytest.raises(ConfigError, match="measured for model 'llama-2-7b'"):
            build_cost_model(config, other)


def test_block_size_note_says_how_an_unmeasured_block_size_is_priced(tmp_path) -> None:
    from pagesim.sim.build import block_size_note

    synthetic = os.path.join(os.path.dirname(__file__), "..", "cost", "data", "synthetic-profile")
    assert block_size_note(synthetic, 16) is None  # measured: 8, 16, 32
    assert block_size_note(synthetic, 64).endswith(
        "measured block sizes 8, 16, 32; block size 64's step costs are taken from block "
        "size 32, the nearest"
    )
    assert "taken from block size 8, the nearest" in block_size_note(synthetic, 4)
    gap = tmp_path / "gap"
    shutil.copytree(synthetic, gap)
    decode = (gap / "decode.csv").read_text().splitlines(keepends=True)
    (gap / "decode.csv").write_text("".join(line for line in decode if not line.startswith("16,")))
    assert block_size_note(gap, 16).endswith("interpolated between block sizes 8 and 32")
    assert block_size_note(tmp_path / "missing", 16) is None  # the simulation reports it


def test_run_notes_a_block_size_the_shipped_tp2_profile_never_timed(capsys) -> None:
    from pagesim.cli.app import main

    argv = [
        "run",
        "--model",
        "llama-3-70b",
        "--gpu",
        "h200",
        "--tensor-parallel-size",
        "2",
        "--num-prompts",
        "5",
        "--quiet",
    ]
    assert main([*argv, "--block-size", "32"]) == 0
    err = capsys.readouterr().err
    assert "llama-3-70b-tp2 measured block sizes 16; block size 32's step costs" in err
    assert main([*argv, "--block-size", "16"]) == 0
    assert "measured block sizes" not in capsys.readouterr().err


def test_a_correction_switched_off_changes_the_priced_step_time() -> None:
    """The drift correction moves a decode step's price; switched off, the step costs what
    the fit without it says, and the other entry points price with the same model."""
    from pagesim.sim.build import band_cost_model, scaled_cost_model

    config = EngineConfig.create(model="llama-2-7b", gpu="h200")
    shipped = default_profile(config)
    decode = BatchShape.decode(32, 2048, 16)
    full = build_cost_model(config, shipped)
    off = build_cost_model(config, shipped, ("drift",))
    assert off is not full and off.step_time(decode) != full.step_time(decode)
    assert "drift" not in off.corrections and "drift" in full.corrections
    assert scaled_cost_model(config, shipped, 1.0) is None  # every correction on: simulate's own
    scaled = scaled_cost_model(config, shipped, 1.0, disabled_corrections=("drift",))
    assert scaled is off
    band = band_cost_model(config, shipped, 1.1, False, ("drift",))
    assert band.step_time(decode) == pytest.approx(1.1 * off.step_time(decode))
    with pytest.raises(ConfigError, match="analytical cost model has no corrections"):
        build_cost_model(config, None, ("drift",))
    with pytest.raises(ConfigError, match="'nope' is unknown"):
        build_cost_model(config, shipped, ("nope",))
