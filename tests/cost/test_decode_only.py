"""`pagesim.cost.decode_only`: a decode-only step priced without a BatchShape equals
`CalibratedCostModel.step_time` of the shape, float for float (first call and memoized)."""

from __future__ import annotations

import numpy as np
import pytest
from test_shared_prefix import _shared_profile  # tests/cost: decode_shared rows, reread fitted

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.decode_only import decode_only_pricer
from pagesim.sim.build import build_cost_model, default_profile


@pytest.fixture(scope="module", params=["llama-2-7b", "llama-3-8b"])
def shipped_model(request):
    config = EngineConfig.create(model=request.param, gpu="h200")
    profile = default_profile(config)
    if profile is None:
        pytest.skip(f"no shipped profile for {request.param}")
    return build_cost_model(config, profile)


def _check(model, rng, count: int) -> None:
    price = decode_only_pricer(model)
    assert price is not None
    for _ in range(count):
        bs = int(rng.choice([8, 16, 32]))
        n = int(rng.integers(1, 300))
        contexts = [int(c) for c in rng.integers(1, 4000, size=n)]
        shared = None if rng.random() < 0.3 else int(rng.integers(0, sum(contexts) + 1))
        shape = BatchShape(bs, n, n, sum(contexts), contexts, shared_context_tokens=shared)
        want = model.step_time(shape)
        for _ in range(2):  # the first call may fill the memos, the second uses them
            got = price(bs, n, sum(contexts), contexts, shared)
            assert got.hex() == want.hex(), (bs, n, shared)


def test_shipped_profiles(shipped_model) -> None:
    _check(shipped_model, np.random.default_rng(1), 150)


def test_profile_with_shared_rows(clean_profile) -> None:
    model = CalibratedCostModel(_shared_profile(clean_profile))
    assert model.reread_fraction  # the reread branch is taken
    _check(model, np.random.default_rng(2), 100)


def test_unknown_models_have_no_pricer() -> None:
    config = EngineConfig.create()
    assert decode_only_pricer(AnalyticalCostModel(config.model_spec, config.gpu_spec)) is None
