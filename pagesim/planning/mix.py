"""Weighted workload mixes written inline: `chat:0.7+code:0.3`.

A sweep's `workload` axis takes shipped names, spec or trace files, and mixes of them with
weights. A mix becomes a small YAML spec (the `mix:` section of the workload schema,
workloads/README.md) written where the run happens, so that a worker on another machine needs
only the component files. The spec's name is derived from the mix text, so that the same mix
gives the same requests (tenant salts and content derive from the name and the seed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import yaml

from pagesim.errors import ConfigError
from pagesim.workload import VLLM_DATASETS, shipped_workloads
from pagesim.workload.spec import check_mix_weights


def is_mix(text: str) -> bool:
    return ":" in text or "+" in text


def parse_mix(text: str) -> list[tuple[str, float]]:
    """`chat:0.7+code:0.3` -> [("chat", 0.7), ("code", 0.3)]; `chat+code` weighs each 1.

    A weight on some components only is refused: `chat:0.7+code` would give code weight 1,
    59 % of the requests, where 30 % was likely meant.
    """
    parts = []
    unweighted = []
    for item in str(text).split("+"):
        name, sep, raw = item.strip().rpartition(":") if ":" in item else (item.strip(), "", "")
        name = name.strip()
        if not name:
            raise ConfigError(f"workload mix {text!r}: empty component")
        try:
            weight = float(raw) if sep else 1.0
        except ValueError:
            raise ConfigError(f"workload mix {text!r}: weight {raw!r} is not a number") from None
        if not weight > 0:
            raise ConfigError(f"workload mix {text!r}: weight of {name!r} must be > 0")
        parts.append((name, weight))
        if not sep:
            unweighted.append(name)
    where = f"workload mix {text!r}: "
    check_mix_weights([repr(n) for n in unweighted], len(parts), where, ConfigError)
    return parts


def check_workload(text: str) -> None:
    """Fail early (one line) on a workload that names no shipped spec and no file."""
    names = [n for n, _ in parse_mix(text)] if is_mix(text) else [text]
    known = shipped_workloads()
    for name in names:
        if (
            name not in known
            and name not in VLLM_DATASETS
            and not Path(name).expanduser().is_file()
        ):
            raise ConfigError(
                f"workload {name!r}: not a shipped workload ({', '.join(known)}) nor a file"
            )


def mix_name(text: str) -> str:
    """A file-safe, deterministic name for a mix: mix-chat0.7-code0.3."""
    parts = [f"{Path(n).name.split('.')[0]}{w:g}" for n, w in parse_mix(text)]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "mix-" + "-".join(parts))


def mix_spec(text: str) -> dict:
    """The YAML spec of a mix (components as names or absolute paths)."""
    comps = []
    for name, weight in parse_mix(text):
        path = Path(name).expanduser()
        ref = str(path.resolve()) if path.is_file() else name
        comps.append({"workload": ref, "weight": weight})
    return {"name": mix_name(text), "mix": comps}


@contextmanager
def workload_ref(text: str) -> Iterator[str]:
    """What `load_workload` takes for `text`: itself, or a temporary spec file for a mix."""
    if not is_mix(text):
        yield text
        return
    with TemporaryDirectory(prefix="pagesim-mix-") as tmp:
        path = Path(tmp) / f"{mix_name(text)}.yaml"
        path.write_text(yaml.safe_dump(mix_spec(text), sort_keys=False))
        yield str(path)
