"""The paged KV cache: blocks, free queue, block pool, prefix-cache hashing, the per-request
manager and block tables. Pure Python, stdlib only (shared by the simulator and the GPU runner).

Re-exports use `name as name`, one per line, so that modules can add theirs independently.
"""

from pagesim.kvcache.block_pool import BlockPool as BlockPool
from pagesim.kvcache.kv_cache_manager import KVCacheManager as KVCacheManager
