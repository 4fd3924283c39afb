"""One scheduler assembly for both worlds: the simulator (`pagesim.sim.build`) and the GPU
replay (`pagesim.gpu.serve`) build their scheduler here, so a setting means the same thing in
a simulated and in a real run."""

from __future__ import annotations

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.sizing import page_size_bytes
from pagesim.scheduler.scheduler import Scheduler


def build_kv_cache_manager(
    config: EngineConfig,
    num_gpu_blocks: int,
    check_invariants: bool = False,
    lazy_hashing: bool = False,
):
    """The paged manager, or a contiguous baseline over the same KV memory. `lazy_hashing`:
    see `pagesim.kvcache.lazy_hashes` (the simulator's choice; same decisions)."""
    if config.allocator == "paged":
        return KVCacheManager(
            num_gpu_blocks=num_gpu_blocks,
            block_size=config.block_size,
            enable_caching=config.enable_prefix_caching,
            sliding_window=_uniform_window(config),
            vllm_compat=config.vllm_compat,
            check_invariants=check_invariants,
            lazy_hashing=lazy_hashing,
        )
    return ContiguousKVCacheManager(
        num_gpu_blocks=num_gpu_blocks,
        block_size=config.block_size,
        policy=config.allocator,
        placement=str(config.contiguous_placement),
        max_model_len=config.max_model_len,
        check_invariants=check_invariants,
    )


def _uniform_window(config: EngineConfig) -> int | None:
    """The window of a model whose every layer slides. A hybrid model's one block table is
    served as full attention (vLLM's --disable-hybrid-kv-cache-manager), as its pool is
    sized (`sizing.kv_capacity`)."""
    model = config.model_spec
    return None if model.is_hybrid else model.sliding_window


def make_scheduler(
    config: EngineConfig,
    num_gpu_blocks: int,
    check_invariants: bool = False,
    lazy_hashing: bool = False,
) -> Scheduler:
    """A scheduler over a KV cache of `num_gpu_blocks` blocks (block 0 is the null block), with
    the swap pool sized from the config's page size."""
    if num_gpu_blocks < 2:
        raise ConfigError(
            f"num_gpu_blocks={num_gpu_blocks}: need at least 2 (one is the null block)"
        )
    manager = build_kv_cache_manager(config, num_gpu_blocks, check_invariants, lazy_hashing)
    page = page_size_bytes(
        config.model_spec, config.block_size, config.kv_cache_dtype, config.tensor_parallel_size
    )
    return Scheduler(config, manager, page_size_bytes=page)
