"""`CalibratedCostModel.decode_step_time`: a decode-only step priced without a BatchShape
equals `step_time` of the shape, float for float (first call and memoized)."""

from __future__ import annotations

import numpy as np
import pytest
from test_shared_prefix import _shared_profile  # tests/cost: decode_shared rows, reread fitted

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.sim.build import build_cost_model, default_profile


@pytest.fixture(scope="module", params=["llama-2-7b", "llama-3-8b"])
def shipped_model(request):
    config = EngineConfig.create(model=request.param, gpu="h200")
    profile = default_profile(config)
    if profile is None:
        pytest.skip(f"no shipped profile for {request.param}")
    return build_cost_model(config, profile)


def _check(model, rng, count: int) -> None:
    for _ in range(count):
        bs = int(rng.choice([8, 16, 32]))
        n = int(rng.integers(1, 300))
        contexts = [int(c) for c in rng.integers(1, 4000, size=n)]
        shared = None if rng.random() < 0.3 else int(rng.integers(0, sum(contexts) + 1))
        shape = BatchShape(bs, n, n, sum(contexts), contexts, shared_context_tokens=shared)
        first = model.decode_step_time(bs, n, sum(contexts), contexts, shared)  # fills memos
        want = model.step_time(shape)
        for got in (first, model.decode_step_time(bs, n, sum(contexts), contexts, shared)):
            assert got.hex() == want.hex(), (bs, n, shared)


def test_shipped_profiles(shipped_model) -> None:
    _check(shipped_model, np.random.default_rng(1), 150)


def test_profile_with_shared_rows(clean_profile) -> None:
    model = CalibratedCostModel(_shared_profile(clean_profile))
    assert model.reread_fraction  # the reread branch is taken
    _check(model, np.random.default_rng(2), 100)


def test_other_models_are_priced_through_step_time() -> None:
    config = EngineConfig.create()
    assert not hasattr(AnalyticalCostModel(config.model_spec, config.gpu_spec), "decode_step_time")
