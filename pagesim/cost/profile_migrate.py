"""Older calibration profiles rewritten in the current format (`pagesim migrate-profile`).

The reader takes one `format_version`; this is the one place that knows the older ones. Each
version added metadata keys whose defaults say what an older file meant (`ADDED_KEYS`), so
converting a file is giving it the current version and saving it again; the tables did not
change (version 2 added allreduce.csv and version 4 multi_prefill.csv, both optional).
"""

from __future__ import annotations

from pathlib import Path

from pagesim.cost.profile import (
    PROFILE_FORMAT_VERSION,
    PROFILE_JSON,
    Profile,
    ProfileError,
    ProfileMetadata,
    load_tables,
    read_profile_json,
)

#: version -> the metadata keys it added (an older file must not hold them), whose defaults
#: say what an older file meant
ADDED_KEYS: dict[int, tuple[str, ...]] = {
    2: ("allreduce_in_step_times",),  # true: a TP profile was timed on the whole group
    3: ("cuda_graph_sizes",),  # empty: eager decode steps
    4: ("cuda_graph_token_sizes", "varlen_block_q", "varlen_tile_n"),  # eager; not recorded
    5: ("decode_tile_n", "decode_programs_per_sm"),  # 0: not recorded
    6: ("overhead_prefill_step_ms", "overhead_per_prefill_ms"),  # None: not measured
}


def migrate_profile(source: str | Path, target: str | Path | None = None) -> tuple[int, Profile]:
    """Read the profile in `source`, of any format version, and save it in the current one to
    `target` (default: over `source`). Returns the version it had and the profile."""
    where = str(Path(source) / PROFILE_JSON)
    data = read_profile_json(source)
    version = data.get("format_version") if isinstance(data, dict) else None
    if type(version) is not int or not 1 <= version <= PROFILE_FORMAT_VERSION:
        raise ProfileError(
            f"{where}: format_version={version!r} is not a version this pagesim knows "
            f"(1 to {PROFILE_FORMAT_VERSION})"
        )
    for added, keys in ADDED_KEYS.items():
        for key in keys:
            if version < added and key in data:
                raise ProfileError(f"{where}: {key} needs format_version {added}")
    meta = ProfileMetadata.from_json({**data, "format_version": PROFILE_FORMAT_VERSION}, where)
    profile = Profile(meta, **load_tables(source))
    profile.save(source if target is None else target)
    return version, profile
