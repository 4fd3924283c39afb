"""One profile format: the reader refuses older versions with a pointer to `pagesim
migrate-profile`, which converts them to what the defaults say they meant."""

from __future__ import annotations

import json

import pytest

from pagesim.cli.app import main
from pagesim.cost.profile import PROFILE_FORMAT_VERSION, Profile, ProfileError
from pagesim.cost.profile_migrate import ADDED_KEYS, migrate_profile


def old_file(profile: Profile, path, version: int) -> dict:
    """`profile` saved as a file of `version`: the keys that later versions added dropped."""
    profile.save(path)
    data = json.loads((path / "profile.json").read_text())
    for added, keys in ADDED_KEYS.items():
        if added > version:
            for key in keys:
                del data[key]
    data["format_version"] = version
    (path / "profile.json").write_text(json.dumps(data))
    return data


@pytest.mark.parametrize("version", range(1, PROFILE_FORMAT_VERSION))
def test_older_versions_are_refused_then_migrate_to_the_same_profile(
    tmp_path, clean_profile, version
):
    path = tmp_path / "old"
    old_file(clean_profile, path, version)
    with pytest.raises(
        ProfileError, match=f"format_version={version} is not supported.*migrate-profile"
    ):
        Profile.load(path)
    was, migrated = migrate_profile(path)
    assert was == version and migrated == clean_profile  # the defaults are what it meant
    assert Profile.load(path) == clean_profile


def test_a_key_newer_than_the_file_is_refused(tmp_path, clean_profile):
    path = tmp_path / "old"
    data = old_file(clean_profile, path, 2)
    data["cuda_graph_sizes"] = [1, 2]
    (path / "profile.json").write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="cuda_graph_sizes needs format_version 3"):
        migrate_profile(path)


def test_cli_migrates_to_another_directory_and_refuses_in_one_line(tmp_path, clean_profile, capsys):
    path = tmp_path / "old"
    old_file(clean_profile, path, 1)
    assert main(["run", "--profile", str(path), "--num-prompts", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pagesim migrate-profile" in err[0]
    assert main(["migrate-profile", str(path), "--output-dir", str(tmp_path / "new")]) == 0
    assert "format_version 1 -> 6" in capsys.readouterr().out
    assert Profile.load(tmp_path / "new") == clean_profile
    assert json.loads((path / "profile.json").read_text())["format_version"] == 1  # untouched
    assert main(["migrate-profile", str(tmp_path / "missing")]) == 2
