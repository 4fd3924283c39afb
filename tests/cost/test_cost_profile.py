"""The calibration profile format: exact round trip, and one-line errors for bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from synthetic_profile import FIXTURE_DIR, make_synthetic_profile

from pagesim.cost.profile import (
    PROFILE_FORMAT_VERSION,
    DecodeRow,
    PrefillRow,
    Profile,
    ProfileError,
    ProfileMetadata,
    profile_dir,
)
from pagesim.errors import ConfigError, PagesimError


def test_fixture_on_disk_is_the_generator_output_and_marked_synthetic(synthetic_profile):
    # drift guard: regenerate with `python tests/cost/synthetic_profile.py`
    assert synthetic_profile == make_synthetic_profile()
    assert synthetic_profile.metadata.synthetic is True
    assert "SYNTHETIC" in synthetic_profile.metadata.notes


def test_save_then_load_is_identical_and_byte_stable(tmp_path, synthetic_profile):
    first = synthetic_profile.save(tmp_path / "a")
    loaded = Profile.load(first)
    assert loaded == synthetic_profile
    second = loaded.save(tmp_path / "b")
    for name in ("profile.json", "decode.csv", "prefill.csv", "mixed.csv", "overhead.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes()


def test_floats_round_trip_exactly(tmp_path, synthetic_profile):
    rows = (
        DecodeRow(16, 3, 7, 0.1 + 0.2, 1 / 3, 2.0**-40, 1e-300, 123456.789e10),
        DecodeRow(16, 4, 9, 1e-7, 2 / 3, 0.7, 5e-324, 1.7976931348623157e308),
    )
    p = synthetic_profile.replace_tables(decode=rows)
    assert Profile.load(p.save(tmp_path)).decode == rows


def test_a_profile_on_disk_must_measure_a_grid(tmp_path, synthetic_profile):
    """One decode row for a block size is a truncated table, not a profile; two points are."""
    row = DecodeRow(16, 3, 7, 1.0, 1.0, 1.0, 0.5, 0.5)
    path = synthetic_profile.replace_tables(decode=(row,)).save(tmp_path / "one")
    with pytest.raises(ProfileError, match="block_size=16 has one row"):
        Profile.load(path)
    two = (row, DecodeRow(16, 3, 9, 1.0, 1.0, 1.0, 0.5, 0.5))
    path = synthetic_profile.replace_tables(decode=two).save(tmp_path / "two")
    assert Profile.load(path).decode == two


def test_optional_tables_may_be_absent(tmp_path, synthetic_profile):
    p = synthetic_profile.replace_tables(mixed=(), overhead=())
    path = synthetic_profile.save(tmp_path)
    p.save(path)  # overwriting removes the stale optional CSVs
    assert not (path / "mixed.csv").exists() and not (path / "overhead.csv").exists()
    assert Profile.load(path) == p


def test_profile_dir_layout():
    assert profile_dir("calibration", "h200", "llama-2-7b") == Path("calibration/h200/llama-2-7b")


def test_profile_error_is_a_config_error():
    assert issubclass(ProfileError, ConfigError) and issubclass(ProfileError, PagesimError)


@pytest.fixture()
def copy(tmp_path) -> Path:
    return Path(shutil.copytree(FIXTURE_DIR, tmp_path / "p"))


def edit_json(path: Path, **changes) -> None:
    data = json.loads((path / "profile.json").read_text())
    for k, v in changes.items():
        if v is ...:
            del data[k]
        else:
            data[k] = v
    (path / "profile.json").write_text(json.dumps(data))


def edit_csv(path: Path, name: str, old: str, new: str, count: int = 1) -> None:
    f = path / name
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new, count))


def expect_error(path: Path, *fragments: str) -> None:
    with pytest.raises(ProfileError) as err:
        Profile.load(path)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_missing_directory(tmp_path):
    expect_error(tmp_path / "nowhere", "no such calibration profile")


def test_bad_json(copy):
    (copy / "profile.json").write_text("{not json")
    expect_error(copy, "profile.json", "not valid JSON")


def test_unsupported_format_version(copy):
    edit_json(copy, format_version=PROFILE_FORMAT_VERSION + 1)
    expect_error(copy, f"format_version={PROFILE_FORMAT_VERSION + 1}", "not supported")


def test_missing_format_version(copy):
    edit_json(copy, format_version=...)
    expect_error(copy, "format_version=None")


def test_missing_metadata_key(copy):
    edit_json(copy, driver=...)
    expect_error(copy, "missing key 'driver'")


def test_unknown_metadata_key(copy):
    edit_json(copy, colour="blue")
    expect_error(copy, "unknown key 'colour'")


def test_wrongly_typed_metadata(copy):
    edit_json(copy, tensor_parallel_size="two")
    expect_error(copy, str(copy / "profile.json"), "tensor_parallel_size='two'")


def test_empty_model_name(copy):
    edit_json(copy, model="")
    expect_error(copy, "model must not be empty")


def test_bad_num_gpu_blocks(copy):
    edit_json(copy, num_gpu_blocks={"sixteen": 3})
    expect_error(copy, "num_gpu_blocks")


def test_missing_required_table(copy):
    (copy / "prefill.csv").unlink()
    expect_error(copy, "prefill.csv", "missing")


def test_missing_column(copy):
    edit_csv(copy, "decode.csv", "context_len,", "ctx,")
    expect_error(copy, "decode.csv", "missing column 'context_len'")


def test_non_numeric_value(copy):
    edit_csv(copy, "prefill.csv", "\n8,16,0,", "\n8,16,zero,")
    expect_error(copy, "prefill.csv line 2", "num_cached_tokens='zero'", "not an integer")


def test_non_finite_value(copy):
    text = (copy / "decode.csv").read_text().splitlines()
    cells = text[1].split(",")
    cells[3] = "nan"
    text[1] = ",".join(cells)
    (copy / "decode.csv").write_text("\n".join(text) + "\n")
    expect_error(copy, "decode.csv line 2", "step_time_ms='nan'")


def test_negative_time(copy):
    text = (copy / "decode.csv").read_text().splitlines()
    cells = text[1].split(",")
    cells[6] = "-1.0"
    text[1] = ",".join(cells)
    (copy / "decode.csv").write_text("\n".join(text) + "\n")
    expect_error(copy, "decode.csv row 1", "attention_ms=-1.0")


def test_zero_batch(copy):
    edit_csv(copy, "decode.csv", "\n8,1,16,", "\n8,0,16,")
    expect_error(copy, "decode.csv row 1", "batch_size=0")


def test_duplicate_grid_point(copy):
    lines = (copy / "decode.csv").read_text().splitlines()
    (copy / "decode.csv").write_text("\n".join(lines + [lines[1]]) + "\n")
    expect_error(
        copy, "decode.csv", "duplicate grid point block_size=8, batch_size=1, context_len=16"
    )


def test_ragged_line(copy):
    edit_csv(copy, "mixed.csv", "\n8,256,0,8,512,", "\n8,256,0,8,")
    expect_error(copy, "mixed.csv line 2", "fields")


def test_empty_table_file(copy):
    (copy / "overhead.csv").write_text("")
    expect_error(copy, "overhead.csv", "empty file")


def test_header_only_required_table(copy):
    (copy / "decode.csv").write_text((copy / "decode.csv").read_text().splitlines()[0] + "\n")
    expect_error(copy, "decode.csv", "no rows")


def test_save_side_validates_records_too(synthetic_profile):
    bad = PrefillRow(16, 8, -3, 1.0, 1.0, 1.0, 0.5, 0.5)
    with pytest.raises(ProfileError, match="num_cached_tokens=-3"):
        synthetic_profile.replace_tables(prefill=(bad,))


def test_save_side_validates_metadata_too():
    with pytest.raises(ProfileError, match="profile.json: kv_cache_dtype='int4'"):
        ProfileMetadata(
            gpu="h200",
            model="m",
            gpu_name="",
            driver="",
            cuda="",
            torch="",
            triton="",
            dtype="",
            date="",
            kv_cache_dtype="int4",
        )


def test_metadata_defaults_mark_real_profiles_as_measured():
    meta = ProfileMetadata(
        gpu="h200",
        model="m",
        gpu_name="NVIDIA H200",
        driver="1",
        cuda="2",
        torch="3",
        triton="4",
        dtype="bfloat16",
        date="2026-01-01",
    )
    assert meta.synthetic is False and meta.format_version == PROFILE_FORMAT_VERSION
