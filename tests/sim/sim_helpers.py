"""Helpers for the simulator tests: a fixed-cost model, a tiny engine, hand-placed arrivals.

Step costs are dyadic (multiples of 2**-10 s), so every simulated time in these tests is an
exact binary fraction and timelines can be compared with `==`.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape, CostModel
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.metrics import MetricsCollector
from pagesim.request import Request
from pagesim.scheduler.scheduler import Scheduler
from pagesim.sim.engine import ServingEngine
from pagesim.sim.runner import CostModelRunner

UNIT = 2.0**-10  # one time unit of the fixed cost model, seconds
A_UNITS = 64  # fixed cost per step, in UNITs
B_UNITS = 1  # cost per scheduled token, in UNITs


def t(units: int | float) -> float:
    """UNITs -> seconds (exact for the small integers used here)."""
    return units * UNIT


@dataclass(frozen=True)
class LinearCost:
    """step_time = a + b * total_tokens (seconds): a cost model whose steps are computed by hand."""

    a: float = A_UNITS * UNIT
    b: float = B_UNITS * UNIT

    def step_time(self, batch: BatchShape) -> float:
        return self.a + self.b * batch.total_tokens


def step_units(num_tokens: int) -> int:
    """A step of `num_tokens` scheduled tokens, in UNITs, under the default `LinearCost`."""
    return A_UNITS + B_UNITS * num_tokens


def req(rid: str, prompt_len: int, max_tokens: int) -> Request:
    """A request whose prompt shares no block with any other request's."""
    base = 1000 * (sum(map(ord, rid)) + 7 * len(rid) + 1)
    return Request(rid, list(range(base, base + prompt_len)), max_tokens)


@dataclass
class TinyEngine:
    env: simpy.Environment
    engine: ServingEngine
    scheduler: Scheduler
    kv: KVCacheManager
    metrics: MetricsCollector
    finished: list[tuple[float, str]]

    def send(self, at_s: float, request: Request) -> None:
        """`request` arrives at simulated time `at_s`."""

        def arrive():
            yield self.env.timeout(at_s)
            self.engine.add_request(request)

        self.env.process(arrive())

    def run(self) -> None:
        self.env.run()

    def step_column(self, name: str) -> list[float]:
        return list(self.metrics.steps[name])


def tiny_engine(
    *,
    num_gpu_blocks: int = 64,
    block_size: int = 16,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 256,
    max_model_len: int = 512,
    cost: CostModel | None = None,
    literal_victim_ties: bool = False,
    **config,
) -> TinyEngine:
    """One replica over a small paged cache, checking KV invariants after every operation."""
    cfg = EngineConfig(
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        **config,
    )
    kv = KVCacheManager(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        enable_caching=cfg.enable_prefix_caching,
        vllm_compat=cfg.vllm_compat,
        check_invariants=True,
    )
    scheduler = Scheduler(cfg, kv, literal_victim_ties=literal_victim_ties)
    env = simpy.Environment()
    metrics = MetricsCollector()
    runner = CostModelRunner(cost or LinearCost())
    engine = ServingEngine(env, scheduler, runner, metrics, lambda: (kv.usage, 0.0, 0.0, 0.0, 0.0))
    finished: list[tuple[float, str]] = []
    engine.on_finish.append(lambda r: finished.append((env.now, r.request_id)))
    return TinyEngine(env, engine, scheduler, kv, metrics, finished)
