"""Older calibration profiles rewritten in the current format (`pagesim migrate-profile`).

The reader takes one `format_version`; this is the one place that knows the older ones. Each
version added metadata keys whose defaults say what an older file meant, so converting a file
is giving it the current version number and saving it again (the tables are unchanged):

    2  allreduce_in_step_times (a version-1 TP profile was timed on the whole group: true)
       and allreduce.csv
    3  cuda_graph_sizes (older runners were eager: empty)
    4  cuda_graph_token_sizes (empty), varlen_block_q and varlen_tile_n (0: not recorded),
       and multi_prefill.csv
    5  decode_tile_n and decode_programs_per_sm (0: not recorded)
    6  overhead_prefill_step_ms and overhead_per_prefill_ms (None: not measured)
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

#: version -> the metadata keys it added (an older file must not hold them)
ADDED_KEYS: dict[int, tuple[str, ...]] = {
    2: ("allreduce_in_step_times",),
    3: ("cuda_graph_sizes",),
    4: ("cuda_graph_token_sizes", "varlen_block_q", "varlen_tile_n"),
    5: ("decode_tile_n", "decode_programs_per_sm"),
    6: ("overhead_prefill_step_ms", "overhead_per_prefill_ms"),
}


def migrate_profile(source: str | Path, target: str | Path | None = None) -> tuple[int, Profile]:
    """Read the profile in `source`, of any format version, and save it in the current one to
    `target` (default: over `source`). Returns the version it had and the profile."""
    where = str(Path(source) / PROFILE_JSON)
    data = read_profile_json(source)
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a JSON object")
    version = data.get("format_version")
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
