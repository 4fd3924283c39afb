"""One scheduler assembly for both worlds: the simulator (`pagesim.sim.build`) and the GPU
replay (`pagesim.gpu.serve`) build their scheduler here, so a setting means the same thing in
a simulated and in a real run."""

from __future__ import annotations

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.deferred_hashes import DeferredHashesFactory
from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.kv_cache_spec import KVCacheConfig
from pagesim.kvcache.sizing import page_size_bytes, serves_hybrid
from pagesim.scheduler.scheduler import Scheduler


def build_kv_cache_manager(
    config: EngineConfig,
    num_gpu_blocks: int,
    check_invariants: bool = False,
    deferred_hashes: DeferredHashesFactory | None = None,
):
    """The paged manager, or a contiguous baseline over the same KV memory. `deferred_hashes`
    builds the paged manager's owner of deferred hashes (`pagesim.kvcache.deferred_hashes`;
    the simulator's choice, same decisions).

    A hybrid model (sliding-window and full-attention layers) gets vLLM's hybrid KV cache
    manager, one block table per KV cache group (vLLM v1 has no swap preemption for it);
    with `disable_hybrid_kv_cache_manager` its layers share one full-attention table
    (`sizing.serves_hybrid`)."""
    model = config.model_spec
    if serves_hybrid(config):
        if config.preemption_mode == "swap":
            raise ConfigError(
                f"preemption_mode='swap': model {config.model} has sliding-window and "
                "full-attention layers, served by the hybrid KV cache manager, which "
                "preempts by recompute only"
            )
        return HybridKVCacheManager(
            KVCacheConfig.from_model(model, config.block_size, num_gpu_blocks),
            enable_caching=config.enable_prefix_caching,
            vllm_compat=config.vllm_compat,
            check_invariants=check_invariants,
            max_model_len=config.max_model_len,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
    if config.allocator == "paged":
        return KVCacheManager(
            num_gpu_blocks=num_gpu_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            sliding_window=config.model_spec.uniform_window,
            vllm_compat=config.vllm_compat,
            check_invariants=check_invariants,
            deferred_hashes=deferred_hashes,
        )
    return ContiguousKVCacheManager(
        num_gpu_blocks=num_gpu_blocks,
        block_size=config.block_size,
        policy=config.allocator,
        placement=str(config.contiguous_placement),
        max_model_len=config.max_model_len,
        check_invariants=check_invariants,
    )


def make_scheduler(
    config: EngineConfig,
    num_gpu_blocks: int,
    check_invariants: bool = False,
    deferred_hashes: DeferredHashesFactory | None = None,
) -> Scheduler:
    """A scheduler over a KV cache of `num_gpu_blocks` blocks (block 0 is the null block), with
    the swap pool sized from the config's page size."""
    if num_gpu_blocks < 2:
        raise ConfigError(
            f"num_gpu_blocks={num_gpu_blocks}: need at least 2 (one is the null block)"
        )
    manager = build_kv_cache_manager(config, num_gpu_blocks, check_invariants, deferred_hashes)
    page = page_size_bytes(
        config.model_spec,
        config.block_size,
        config.kv_cache_dtype,
        config.tensor_parallel_size,
        hybrid_kv_cache_manager=serves_hybrid(config),
    )
    return Scheduler(config, manager, page_size_bytes=page)
