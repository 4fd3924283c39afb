"""What a KV cache manager answers from its one block pool, written once for the dense
(`KVCacheManager`) and the hybrid (`HybridKVCacheManager`) managers: usage and free blocks,
and the cache-wide operations (reset, interval stats, KV events)."""

from __future__ import annotations

from pagesim.kvcache.block_pool import BlockPool, KVCacheEvent
from pagesim.kvcache.prefix_stats import PrefixCacheStats


class BlockPoolViews:
    """Mixin: the manager sets `block_pool`, `prefix_cache_stats` and `_interval_stats`."""

    block_pool: BlockPool
    prefix_cache_stats: PrefixCacheStats
    _interval_stats: PrefixCacheStats

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

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache stats since the previous call (vLLM's interval stats), then reset."""
        stats, self._interval_stats = self._interval_stats, PrefixCacheStats()
        return stats

    def take_events(self) -> list[KVCacheEvent]:
        """KV events (stored / removed blocks) since the last call; needs enable_kv_cache_events."""
        return self.block_pool.take_events()
