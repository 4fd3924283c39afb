"""The data pagesim ships inside the package: workloads and their traces, calibration
profiles, the parity golden files and the models' config.json files.

Everything is found through `importlib.resources`, so a built wheel installed anywhere finds
its own files from any working folder. pagesim is never installed zipped; the folders are real
directories, and a missing one is a broken install, reported loudly rather than passed over.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from pagesim.errors import PagesimError

__all__ = [
    "calibration_dir",
    "golden_dir",
    "models_dir",
    "shipped_relative",
    "transfer_dir",
    "workloads_dir",
]


def _shipped(name: str) -> Path:
    path = Path(str(files("pagesim.data") / name))
    if not path.is_dir():
        raise PagesimError(
            f"pagesim's shipped {name}/ folder is missing from {path.parent} "
            "(a broken install: reinstall pagesim)"
        )
    return path


def workloads_dir() -> Path:
    """The shipped workload specs (`<name>.yaml`) and their traces (`traces/`)."""
    return _shipped("workloads")


def calibration_dir() -> Path:
    """The shipped calibration profiles, `<gpu>/<model>[-tp<N>]/profile.json`."""
    return _shipped("calibration")


def golden_dir() -> Path:
    """The parity golden files: vLLM's own scheduling decisions, recorded per release."""
    return _shipped("parity")


def models_dir() -> Path:
    """The shipped Hugging Face model configs, `<name>.json` (sources in its README)."""
    return _shipped("models")


def transfer_dir() -> Path:
    """The transfer cost model's measured errors per GPU (`errors.csv`), written by
    benchmarks/transfer_vs_vidur.py."""
    return _shipped("transfer")


def shipped_relative(path: str | Path) -> str | None:
    """`path` as `<folder>/<rest>` when it lies inside the shipped data (a stable name that
    does not depend on where pagesim is installed), else None."""
    resolved = Path(path).resolve()
    root = Path(str(files("pagesim.data"))).resolve()
    if resolved.is_relative_to(root):
        return resolved.relative_to(root).as_posix()
    return None
