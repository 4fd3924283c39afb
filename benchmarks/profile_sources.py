"""The shipped merged profiles, re-made from the calibrations they were merged from (no GPU).

The shipped H200 profiles of llama-2-7b, llama-3-8b and qwen2.5-7b are the medians of several
GPU calls' calibrations (`pagesim merge-profiles`); their `notes` list when each source was
measured. The sources themselves left the tree with the research record; they are in git at
`REV` (later ones in the tree, `IN_TREE`). This finds each source by its date, merges them
again, checks that the merge gives the shipped profile exactly, and prints each source's level
against it (`pagesim.cost.profile_merge.source_scales`). With --write it writes the merges over
the shipped profiles instead (after a change to the merge).

    python benchmarks/profile_sources.py [--write]

Run from a git checkout that holds `REV`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from pagesim.cost.profile import PROFILE_JSON, Profile
from pagesim.cost.profile_merge import merge_profiles
from pagesim.cost.profile_rows import TABLES
from pagesim.data import calibration_dir

#: the last commit whose tree holds the source calibrations (results/validation/<call>/profile)
REV = "6480e9d^"
MERGED = ("llama-2-7b", "llama-3-8b", "qwen2.5-7b")


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], check=True, capture_output=True).stdout


#: calibrations made after REV, kept in the tree with the out-of-sample runs they came with
IN_TREE = Path("results/out_of_sample")


def source_dirs(model: str) -> dict[str, str]:
    """Measured date -> the folder of every calibration of `model` on the H200: at REV, or in
    the tree under `IN_TREE`."""
    names = _git("ls-tree", "-r", "--name-only", REV, "results/validation").decode().split()
    out: dict[str, str] = {}
    for name in names:
        if name.endswith(f"/profile/h200/{model}/{PROFILE_JSON}"):
            meta = json.loads(_git("show", f"{REV}:{name}"))
            out.setdefault(meta["date"], name.rsplit("/", 1)[0])
    for path in sorted(IN_TREE.glob(f"**/profile/h200/{model}/{PROFILE_JSON}")):
        out.setdefault(json.loads(path.read_text())["date"], str(path.parent))
    return out


def extract(folder: str, into: Path) -> Path:
    """A copy of one source profile folder (from the tree if it is there, else at REV)."""
    into.mkdir(parents=True)
    if Path(folder).is_dir():
        for path in Path(folder).iterdir():
            (into / path.name).write_bytes(path.read_bytes())
        return into
    names = _git("ls-tree", "--name-only", f"{REV}:{folder}").decode().split()
    for name in names:
        (into / name).write_bytes(_git("show", f"{REV}:{folder}/{name}"))
    return into


def recover(model: str, work: Path) -> tuple[Profile, list[str], list[Profile]]:
    """The shipped profile, its sources' folders and the sources, in the order of its notes."""
    shipped = Profile.load(calibration_dir() / "h200" / model)
    dates = shipped.metadata.notes.split("measured ", 1)[1].split("; the first", 1)[0]
    by_date = source_dirs(model)
    folders = [by_date[d] for d in dates.split(", ")]
    sources = [
        Profile.load(extract(f, work / model / str(i))) for i, f in enumerate(folders, start=1)
    ]
    return shipped, folders, sources


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the merges over the shipped files")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for model in MERGED:
            shipped, folders, sources = recover(model, Path(tmp))
            merged = merge_profiles(sources)
            if args.write:
                merged.save(calibration_dir() / "h200" / model)
            elif merged != shipped:
                differ = [n for n in TABLES if getattr(merged, n) != getattr(shipped, n)]
                raise SystemExit(
                    f"{model}: merging the sources does not give the shipped profile "
                    f"({', '.join(differ) or 'profile.json'} differ; --write re-makes it)"
                )
            scales = merged.metadata.source_scales or []
            print(f"{model}: {len(sources)} sources, step-time level against the merged profile")
            for folder, source, scale in zip(folders, sources, scales, strict=True):
                print(f"  {folder} ({source.metadata.date}): x {scale:.4f}")
            print(f"  spread: x {min(scales):.4f} to x {max(scales):.4f}")


if __name__ == "__main__":
    main()
