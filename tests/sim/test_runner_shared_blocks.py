"""The simulator's runner hands the cost model the shared block references when it prices
shared-prefix reads, and nothing otherwise."""

from __future__ import annotations

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.sim.build import build_scheduler
from pagesim.sim.runner import CostModelRunner, shared_blocks_counter


class _Recorder:
    """A cost model that prices shared reads and remembers the shapes it saw."""

    reread_fraction = {16: 0.75}

    def __init__(self) -> None:
        self.shapes = []

    def step_time(self, shape) -> float:
        self.shapes.append(shape)
        return 0.01


def test_counter_only_for_models_that_price_shared_reads() -> None:
    config = EngineConfig.create(model="llama-2-7b", gpu="h200", num_gpu_blocks_override=100)
    scheduler = build_scheduler(config)
    pool = scheduler.kv_cache_manager.block_pool
    analytical = AnalyticalCostModel(config.model_spec, config.gpu_spec)
    assert shared_blocks_counter(analytical, scheduler) is None
    counter = shared_blocks_counter(_Recorder(), scheduler)
    assert counter() == 0  # nothing held yet
    blocks = pool.get_new_blocks(7)
    assert counter() == 0  # held by one request each: nothing shared
    pool.touch(blocks[:3])  # a second request hits the first three
    assert counter() == 6
    pool.touch(blocks[:1])  # and a third the first one
    assert counter() == 7
    pool.free_blocks(blocks[:3])
    assert counter() == 2  # block 0 still held twice
    pool.free_blocks(blocks[:1])
    assert counter() == 0
    pool.free_blocks(blocks)
    assert counter() == 0


def test_decode_shapes_carry_the_shared_tokens() -> None:
    cost = _Recorder()
    runner = CostModelRunner(cost, shared_block_refs=lambda: 5)
    runner.bulk_decode_step_time(16, 3, 3000, [1000, 1000, 1000])
    assert cost.shapes[-1].shared_context_tokens == 5 * 16
    plain = CostModelRunner(cost)
    plain.bulk_decode_step_time(16, 3, 3000, [1000, 1000, 1000])
    assert cost.shapes[-1].shared_context_tokens is None
