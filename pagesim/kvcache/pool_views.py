"""What a KV cache manager answers from its one block pool, written once for the dense
(`KVCacheManager`) and the hybrid (`HybridKVCacheManager`) managers: usage and free blocks,
and the cache-wide operations (reset, interval stats, KV events)."""

from __future__ import annotations

from typing import ClassVar

from pagesim.config import VLLM_COMPAT
from pagesim.errors import ConfigError
from pagesim.kvcache.block_pool import BlockPool, KVCacheEvent
from pagesim.kvcache.prefix_stats import PrefixCacheStats, PrefixStatsCounters

# vllm_compat -> the pool's free order
_FREE_ORDER = {"0.33": "lifo_unhashed", "0.23": "classic"}


class BlockPoolViews(PrefixStatsCounters):
    """Mixin: the manager calls `_init_block_pool` in its constructor."""

    # Blocks anywhere in the pool, not one region per request (`ContiguousKVCacheManager`):
    # what a caller that splits KV waste asks instead of the manager's type.
    is_contiguous: ClassVar[bool] = False
    block_pool: BlockPool
    enable_caching: bool
    vllm_compat: str
    max_model_len: int | None

    def _init_block_pool(
        self,
        num_blocks: int,
        enable_caching: bool,
        vllm_compat: str,
        max_model_len: int | None,
        enable_kv_cache_events: bool,
    ) -> None:
        """Check the arguments both managers take, then make the pool in the free order of
        `vllm_compat` and the prefix-cache counters."""
        if vllm_compat not in VLLM_COMPAT:
            raise ConfigError(
                f"vllm_compat={vllm_compat!r}: choose one of {', '.join(VLLM_COMPAT)}"
            )
        if max_model_len is not None and max_model_len < 1:
            raise ConfigError(f"max_model_len={max_model_len!r}: must be >= 1")
        self.enable_caching = enable_caching
        self.vllm_compat = vllm_compat
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(
            num_blocks, enable_caching, _FREE_ORDER[vllm_compat], enable_kv_cache_events
        )
        self.prefix_cache_stats = PrefixCacheStats()  # since construction (or reset)
        self._interval_stats = PrefixCacheStats()  # since the last make_prefix_cache_stats()

    @property
    def usage(self) -> float:
        """Used blocks / usable blocks, in [0, 1]."""
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue (cached eviction candidates included)."""
        return self.block_pool.free_block_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        """num_gpu_blocks - 1: the null block is never handed out."""
        return self.block_pool.num_usable_blocks

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; fails (False) while any block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats.reset = self._interval_stats.reset = True
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """KV events (stored / removed blocks) since the last call; needs enable_kv_cache_events."""
        return self.block_pool.take_events()
