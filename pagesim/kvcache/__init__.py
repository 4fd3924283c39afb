"""The paged KV cache: blocks, free queue, block pool, prefix-cache hashing, the per-request
manager and block tables. Pure Python, stdlib only (shared by the simulator and the GPU runner).

Re-exports use `name as name`, one per line, so that modules can add theirs independently.
"""

from pagesim.kvcache.block import FreeKVCacheBlockQueue as FreeKVCacheBlockQueue
from pagesim.kvcache.block import KVCacheBlock as KVCacheBlock
from pagesim.kvcache.block_pool import FREE_ORDERS as FREE_ORDERS
from pagesim.kvcache.block_pool import BlockPool as BlockPool
from pagesim.kvcache.hashing import NONE_HASH as NONE_HASH
from pagesim.kvcache.hashing import BlockHash as BlockHash
from pagesim.kvcache.hashing import BlockHasher as BlockHasher
from pagesim.kvcache.hashing import hash_block_tokens as hash_block_tokens
from pagesim.kvcache.invariants import InvariantViolation as InvariantViolation
from pagesim.kvcache.invariants import check_block_pool as check_block_pool
from pagesim.kvcache.invariants import check_kv_cache_manager as check_kv_cache_manager
from pagesim.kvcache.kv_cache_manager import KVCacheBlocks as KVCacheBlocks
from pagesim.kvcache.kv_cache_manager import KVCacheManager as KVCacheManager
from pagesim.kvcache.prefix_stats import PrefixCacheStats as PrefixCacheStats
