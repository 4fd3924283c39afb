"""Fixtures for the cost-model tests: test-local specs and the SYNTHETIC profile."""

from __future__ import annotations

import pytest
from synthetic_profile import FIXTURE_DIR, GPU, MODEL, make_synthetic_profile

from pagesim.cost.profile import Profile
from pagesim.specs import GPUSpec, ModelSpec


@pytest.fixture(scope="session")
def llama7b() -> ModelSpec:
    return MODEL


@pytest.fixture(scope="session")
def h200() -> GPUSpec:
    return GPU


@pytest.fixture(scope="session")
def synthetic_profile() -> Profile:
    """The on-disk SYNTHETIC fixture (2 % noise)."""
    return Profile.load(FIXTURE_DIR)


@pytest.fixture(scope="session")
def clean_profile() -> Profile:
    """The same grid without noise: the analytical model's device times, rounded to 10 ns."""
    return make_synthetic_profile(noise=0.0)
