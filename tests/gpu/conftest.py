"""Fixtures for the Triton kernel tests.

Without torch or triton the whole folder is skipped. Without CUDA the kernels run on the CPU
under `TRITON_INTERPRET=1`, set here before triton (and the kernel modules, whose `@triton.jit`
reads it) are imported; tests marked `gpu` (bf16, large shapes) are then skipped, since the
interpreter computes bf16 wrongly and large shapes would take minutes.
"""

from __future__ import annotations

import importlib.util
import os
import zlib

import pytest

HAVE_TORCH_TRITON = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))

if not HAVE_TORCH_TRITON:
    collect_ignore_glob = ["test_*.py"]
    HAVE_CUDA = False
else:
    import torch  # importing torch does not import triton

    HAVE_CUDA = torch.cuda.is_available()
    if not HAVE_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items):
    if HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if item.get_closest_marker("gpu") and str(item.path).startswith(here):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    """Where the kernels run: the GPU when there is one, else the CPU interpreter."""
    return "cuda" if HAVE_CUDA else "cpu"


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the test's id, so every test draws its own fixed inputs."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))
