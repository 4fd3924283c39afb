"""Every notebook in notebooks/ runs top to bottom with small parameters.

PAGESIM_NOTEBOOK_SMALL=1 makes the notebooks run a reduced version and write their figures
to a temporary folder (results/figures keeps the full-size ones).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (test extra)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (test extra)")

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_four_notebooks() -> None:
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PAGESIM_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("PAGESIM_FIGURES_DIR", str(tmp_path))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs and all(p.startswith(path.stem[:2].replace("0", "nb", 1)) for p in pngs), pngs
    assert os.environ["PAGESIM_NOTEBOOK_SMALL"] == "1"
