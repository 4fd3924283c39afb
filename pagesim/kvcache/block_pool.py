"""The block pool: allocation, freeing, prefix-cache registration and lazy LRU eviction
(vLLM v1's `BlockPool`).

Block 0 is the null block: a placeholder for table entries that hold no KV (blocks of a
sliding-window request that fell out of the window). It is taken out of the free queue at
construction and never handed out, so `num_gpu_blocks` blocks give `num_gpu_blocks - 1` usable
ones, as in vLLM.

A *cached* block is a full block whose hash is registered in `cached_block_hash_to_block`. It may
be in use by requests or sit in the free queue as an eviction candidate; its hash is dropped only
when `get_new_blocks` hands it out again, so the eviction order is the order in which cached
blocks reach the head of the free queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pagesim.errors import ConfigError, InternalError
from pagesim.kvcache.block import FreeKVCacheBlockQueue, KVCacheBlock
from pagesim.kvcache.deferred_hashes import DeferredHashes

# Where `free_blocks` puts blocks whose ref_cnt reaches 0:
#   "lifo_unhashed" (vLLM >= 0.24): blocks without a hash at the head (reused first), hashed
#                                   blocks at the tail (evicted last);
#   "classic"       (vLLM <= 0.23): every block at the tail (plain LRU).
FREE_ORDERS: tuple[str, ...] = ("lifo_unhashed", "classic")


class BlockStored(NamedTuple):
    """KV event: these blocks were registered in the prefix cache (vLLM's `BlockStored`)."""

    block_ids: tuple[int, ...]
    block_hashes: tuple[bytes, ...]


class BlockRemoved(NamedTuple):
    """KV event: this cached block was evicted (its hash dropped) on reuse."""

    block_id: int
    block_hash: bytes


class AllBlocksCleared(NamedTuple):
    """KV event: `reset_prefix_cache` dropped every cached hash."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class BlockPool:
    """All `num_gpu_blocks` blocks, the free queue and the hash -> cached block map.

    `cached_block_hash_to_block` maps a hash to its block, or, when several blocks hold the same
    content, to a dict `{block_id: block}` in insertion order (vLLM does not de-duplicate: block
    tables are append-only, so a full block keeps its id even if an identical block exists).
    A lookup returns the first-inserted block of a hash.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool = True,
        free_order: str = "lifo_unhashed",
        enable_kv_cache_events: bool = False,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ConfigError(
                f"num_gpu_blocks={num_gpu_blocks!r}: must be an int >= 2 "
                "(block 0 is the null block)"
            )
        if free_order not in FREE_ORDERS:
            raise ConfigError(f"free_order={free_order!r}: choose one of {', '.join(FREE_ORDERS)}")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_usable_blocks = num_gpu_blocks - 1
        self.enable_caching = enable_caching
        self.free_order = free_order
        self._lifo_unhashed = free_order == "lifo_unhashed"
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}
        # The owner of deferred hashes (`pagesim.kvcache.deferred_hashes`), set by the manager,
        # and the placeholders of the deferred blocks handed out since it last took them.
        self.deferred_hashes: DeferredHashes | None = None
        self.handed_out_placeholders: list[bytes] = []
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = enable_kv_cache_events
        self.kv_event_queue: list[KVCacheEvent] = []
        # Sum of ref_cnt over blocks with ref_cnt >= 2: block-table entries that point at a
        # block another request holds too (what a step reads from shared prefix blocks).
        self.num_shared_refs = 0

    # ---- lookups -------------------------------------------------------------------------
    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """The cached block holding `block_hash` (the first one if duplicated), or None."""
        found = self.cached_block_hash_to_block.get(block_hash)
        if found is None or isinstance(found, KVCacheBlock):
            return found
        return next(iter(found.values()))

    def get_num_free_blocks(self) -> int:
        """Blocks in the free queue, cached eviction candidates included."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Used blocks / usable blocks, in [0, 1] (vLLM's `kv_cache_usage_perc`)."""
        usable = self.num_usable_blocks
        return (usable - self.free_block_queue.num_free_blocks) / usable

    # ---- allocation ----------------------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` blocks from the head of the free queue, with ref_cnt 1.

        A popped block that still holds a cached hash is evicted from the cache here (lazy
        eviction). Raises `InternalError` if fewer blocks are free: callers check first.
        """
        queue = self.free_block_queue
        if num_blocks > queue.num_free_blocks:
            raise InternalError(
                f"num_blocks={num_blocks}: only {queue.num_free_blocks} blocks are free"
            )
        if num_blocks <= 0:
            return []
        blocks = queue.popleft_n(num_blocks)
        for block in blocks:
            if block.block_hash is not None:
                self.evict_cached_block(block)
            block.ref_cnt = 1
        return blocks

    def evict_cached_block(self, block: KVCacheBlock) -> None:
        """Drop `block`'s hash from the cache map (it is being reused). A deferred block's
        placeholder was never in the map: it goes to `handed_out_placeholders` instead."""
        block_hash = block.block_hash
        if block_hash is None:
            raise InternalError(f"block_id={block.block_id}: no registered hash to evict")
        cache = self.cached_block_hash_to_block
        found = cache.get(block_hash)
        if found is None:  # a placeholder: nothing in the map, no event
            block.block_hash = None
            self.handed_out_placeholders.append(block_hash)
            return
        if found is block:
            del cache[block_hash]
        elif isinstance(found, dict):
            found.pop(block.block_id, None)
            if len(found) == 1:  # back to the single-block form; order is kept
                cache[block_hash] = next(iter(found.values()))
            elif not found:
                del cache[block_hash]
        block.block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(BlockRemoved(block.block_id, block_hash))

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks: ref_cnt += 1, and a block that was an
        eviction candidate (ref_cnt 0) leaves the free queue. The null block is skipped."""
        queue = self.free_block_queue
        shared = self.num_shared_refs
        for block in blocks:
            r = block.ref_cnt
            if r == 0:
                if block.is_null:
                    continue
                queue.remove(block)
            elif r == 1:
                shared += 2
            else:
                shared += 1
            block.ref_cnt = r + 1
        self.num_shared_refs = shared

    # ---- caching -------------------------------------------------------------------------
    def cache_full_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        block_hashes: Sequence[bytes],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register `blocks[num_cached_blocks:num_full_blocks]` under their hashes.

        `block_hashes[i]` is the hash of block i of the request (`Request.block_hashes`).
        Null blocks and blocks that already hold a hash (prefix hits) are skipped.
        """
        if not self.enable_caching or num_cached_blocks >= num_full_blocks:
            return
        events = self.enable_kv_cache_events
        register = self._register
        stored_ids: list[int] = []
        stored_hashes: list[bytes] = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is None and not block.is_null:
                register(block, block_hashes[i])
                if events:
                    stored_ids.append(block.block_id)
                    stored_hashes.append(block_hashes[i])
        if stored_ids:
            self.kv_event_queue.append(BlockStored(tuple(stored_ids), tuple(stored_hashes)))

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """`cache_full_blocks` of one block (a decode filling a block)."""
        if block.block_hash is not None or block.is_null or not self.enable_caching:
            return
        if self.enable_kv_cache_events:
            self.cache_full_blocks((block,), (block_hash,), 0, 1)
        else:
            self._register(block, block_hash)

    def _register(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Give an unhashed block its hash and enter it in the hash map; a second block of an
        already cached hash turns the entry into {block_id: block} of all of them."""
        block.block_hash = block_hash
        found = self.cached_block_hash_to_block.setdefault(block_hash, block)
        if found is not block:  # a duplicate of a cached block
            if isinstance(found, dict):
                found[block.block_id] = block
            else:
                self.cached_block_hash_to_block[block_hash] = {
                    found.block_id: found,
                    block.block_id: block,
                }

    # ---- freeing -------------------------------------------------------------------------
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching ref_cnt 0 join the free queue.

        `ordered_blocks` is in eviction priority: callers pass a request's blocks in reverse,
        so its tail blocks are evicted first. Where they go depends on `free_order` (see
        FREE_ORDERS). The null block is skipped.
        """
        # One pass: blocks reaching ref_cnt 0 are linked in at the tail as they come (what
        # `append_n` of them in order does), except that under "lifo_unhashed" the unhashed
        # ones are put at the head after it.
        queue = self.free_block_queue
        lifo_unhashed = self._lifo_unhashed
        to_head: list[KVCacheBlock] = []
        tail = queue.fake_free_list_tail
        last: KVCacheBlock = tail.prev_free_block  # type: ignore[assignment]
        num_tail = 0
        shared = self.num_shared_refs
        for block in ordered_blocks:
            if block.is_null:
                continue
            r = block.ref_cnt
            if r > 1:
                shared -= 2 if r == 2 else 1
            block.ref_cnt = r - 1
            if r == 1:
                if lifo_unhashed and block.block_hash is None:
                    to_head.append(block)
                else:
                    last.next_free_block = block
                    block.prev_free_block = last
                    last = block
                    num_tail += 1
        self.num_shared_refs = shared
        if num_tail:
            last.next_free_block = tail
            tail.prev_free_block = last
            queue.num_free_blocks += num_tail
        if to_head:
            queue.prepend_n(to_head)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash. Only possible when no block is in use; returns success."""
        if self.free_block_queue.num_free_blocks != self.num_usable_blocks:
            return False
        self.cached_block_hash_to_block = {}
        if self.deferred_hashes is not None:
            self.deferred_hashes.clear()
        for block in self.blocks:
            block.block_hash = None
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """The KV events since the last call, oldest first (empty unless events are enabled)."""
        events, self.kv_event_queue = self.kv_event_queue, []
        return events
