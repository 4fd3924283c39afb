"""GPU commands size and name what they measure after the card they run on."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pagesim.cli.app import gpu_engine_config, local_gpu  # noqa: E402


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA GeForce RTX 4090", "h200"),  # no spec: the shipped profiles' GPU
    ],
)
def test_the_engine_is_the_local_cards(monkeypatch, name: str, key: str) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    assert local_gpu() == key
    assert gpu_engine_config("llama-3-8b").gpu == key


def test_without_a_gpu_it_is_the_h200(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_gpu() == "h200"
