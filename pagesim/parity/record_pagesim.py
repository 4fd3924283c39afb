"""Record a decision log from pagesim's own Scheduler and KVCacheManager.

The same replay loop as `record_vllm` (`replay.replay`), the same workload, the same fake
outputs (`synthetic_token`), so the two logs differ only where the engines decide differently.
"""

from __future__ import annotations

from typing import Any

from pagesim import __version__
from pagesim.config import EngineConfig
from pagesim.kvcache.block_pool import BlockRemoved
from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from pagesim.parity.decisions import DecisionLog
from pagesim.parity.replay import StepObservation, replay
from pagesim.parity.workloads import ParityRequest, ParityWorkload
from pagesim.request import Request
from pagesim.scheduler.output import BlockIds, ModelRunnerOutput, synthetic_token
from pagesim.scheduler.scheduler import Scheduler

#: The workload's engine settings that `EngineConfig` takes under the same (vLLM) name; every
#: workload names them all.
SHARED_ENGINE_KEYS = (
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "long_prefill_token_threshold",
    "scheduling_policy",
)


def engine_config(engine: dict[str, Any], vllm_compat: str) -> EngineConfig:
    """pagesim's `EngineConfig` for a workload's engine settings (vLLM names)."""
    return EngineConfig(
        num_gpu_blocks_override=engine["num_gpu_blocks"],
        scheduler_reserve_full_isl=engine.get("scheduler_reserve_full_isl", True),
        vllm_compat=vllm_compat,
        **{key: engine[key] for key in SHARED_ENGINE_KEYS},
    )


def kv_cache_config(
    kv_cache_groups: list[list[Any]], block_size: int, num_blocks: int
) -> KVCacheConfig:
    """A workload's hybrid layout (["full"] / ["sliding", window] per group) as a
    `KVCacheConfig` of one layer per group."""
    specs: list[KVCacheGroupSpec] = []
    for group in kv_cache_groups:
        spec: KVCacheSpec = (
            FullAttentionSpec(block_size)
            if group[0] == "full"
            else SlidingWindowSpec(block_size, int(group[1]))
        )
        specs.append(KVCacheGroupSpec(1, spec))
    return KVCacheConfig(num_blocks, tuple(specs))


class PagesimEngine:
    """pagesim's Scheduler wrapped as a `replay.EngineAdapter`."""

    def __init__(
        self, config: EngineConfig, kv_cache_groups: list[list[Any]] | None = None
    ) -> None:
        assert config.num_gpu_blocks_override is not None
        self.kv: KVCacheManager | HybridKVCacheManager
        options: dict[str, Any] = {
            "enable_caching": config.enable_prefix_caching,
            "vllm_compat": config.vllm_compat,
            "max_model_len": config.max_model_len,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "enable_kv_cache_events": True,
        }
        num_blocks, block_size = config.num_gpu_blocks_override, config.block_size
        if kv_cache_groups is not None and len(kv_cache_groups) > 1:
            groups = kv_cache_config(kv_cache_groups, block_size, num_blocks)
            self.kv = HybridKVCacheManager(groups, **options)
        else:
            self.kv = KVCacheManager(num_blocks, block_size, **options)
        # vLLM's literal victim rule: the harness gives both sides the same tied times
        self.scheduler = Scheduler(config, self.kv, literal_victim_ties=True)
        self._pool = self.kv.block_pool

    def add_request(
        self, request: ParityRequest, prompt_token_ids: list[int], arrival_step: int
    ) -> None:
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=prompt_token_ids,
            max_tokens=request.max_tokens,
            cache_salt=request.cache_salt,
            arrival_time=float(arrival_step),
            priority=request.priority,
        )
        if not self.scheduler.add_request(req):
            raise ValueError(f"request {request.request_id} rejected: {req.reject_reason}")

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self._pool.free_block_queue.get_all_free_blocks()]

    def _evicted(self) -> list[int]:
        return [e.block_id for e in self.kv.take_events() if isinstance(e, BlockRemoved)]

    def step(self) -> StepObservation:
        s = self.scheduler
        admitting = {r.request_id for r in s.waiting}
        out = s.schedule()
        scheduled = [(sr.request_id, sr.num_new_tokens) for sr in out.scheduled]
        hits = [
            (sr.request_id, sr.num_computed_tokens)
            for sr in out.scheduled
            if sr.request_id in admitting
        ]
        hybrid = isinstance(self.kv, HybridKVCacheManager)
        tables: dict[str, list[int] | tuple[list[int], ...]] = {
            sr.request_id: _table(self.kv.get_block_ids(sr.request_id), hybrid)
            for sr in out.scheduled
        }
        sampled = {}
        for sr in out.scheduled:
            req = sr.request
            if req.num_computed_tokens >= req.num_tokens:
                sampled[sr.request_id] = synthetic_token(req, req.num_output_tokens)
        finished = s.update_from_output(
            out, ModelRunnerOutput(step_time_s=0.0, sampled_token_ids=sampled)
        )
        return StepObservation(
            scheduled=scheduled,
            hits=hits,
            preempted=list(out.preempted_req_ids),
            block_tables=tables,
            finished=[r.request_id for r in finished],
            evicted=self._evicted(),
            free_queue=self.free_queue(),
        )


def _table(block_ids: BlockIds, hybrid: bool) -> list[int] | tuple[list[int], ...]:
    """A scheduled request's table as the replay takes it: one row, or a tuple of group rows."""
    rows: list[Any] = list(block_ids)
    return tuple(list(r) for r in rows) if hybrid else [int(b) for b in rows]


def record(workload: ParityWorkload, vllm_compat: str = "0.33") -> DecisionLog:
    """Replay `workload` through pagesim's Scheduler and return its `DecisionLog`."""
    eng = PagesimEngine(
        engine_config(workload.engine, vllm_compat), workload.engine.get("kv_cache_groups")
    )
    return replay(
        workload, eng, {"engine": "pagesim", "version": __version__}, vllm_compat=vllm_compat
    )
