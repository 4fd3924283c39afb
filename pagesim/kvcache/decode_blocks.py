"""Decode steps one block event at a time: the calls of the simulator's decode fast path
(`pagesim.sim.fast_path`), as methods of `KVCacheManager`.

A decode that only moves a request forward by one token changes the manager in two places
only: when its context fills its row (a block is appended) and when its token fills a block
(the block is cached). These calls do exactly what `allocate_slots(request, 1)` does then,
without reading the request's tokens, so the fast path can leave the request's counters
behind; with lazy hashing the filled blocks may also be cached later, several in one call
(`cache_decode_blocks`, see `pagesim.sim.pending_blocks`). `tests/kvcache/test_decode_events.py`
holds them to `allocate_slots`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from pagesim.errors import InternalError
from pagesim.kvcache.invariants import check_kv_cache_manager
from pagesim.kvcache.lazy_hashes import DeferredBlocks, LazyHashes

if TYPE_CHECKING:
    from pagesim.kvcache.block import KVCacheBlock
    from pagesim.kvcache.block_pool import BlockPool
    from pagesim.kvcache.hashing import BlockHasher
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.request import Request


class DecodeBlockEvents:
    """Mixin of `KVCacheManager`: these are the manager's attributes it uses."""

    __slots__ = ()
    req_to_blocks: dict[str, list[KVCacheBlock]]
    req_to_block_ids: dict[str, list[int]]
    num_cached_block: dict[str, int]
    enable_caching: bool
    check_invariants: bool
    block_size: int
    block_pool: BlockPool
    hasher: BlockHasher
    _lazy: LazyHashes | None
    _cache_blocks: Callable[[Request, list[KVCacheBlock], int], None]

    def append_decode_block(self, request_id: str, *, late_blocks: bool = False) -> bool:
        """One more block at the end of a running request's row: what `allocate_slots(request,
        1)` does for a full-attention decode whose context fills its row exactly (every full
        block of the row already cached). False: no free block; nothing changed.

        The caller guarantees the rest of `allocate_slots`' fast-path conditions: no sliding
        window, no copy-on-write, the max_model_len cap not reached. `late_blocks`: full
        blocks of the row may still be uncached; the caller caches them later
        (`cache_decode_blocks`, `pagesim.sim.pending_blocks` says when that is exact).
        """
        row = self.req_to_blocks[request_id]
        if (
            self.enable_caching
            and not late_blocks
            and self.num_cached_block[request_id] != len(row)
        ):
            raise InternalError(
                f"request_id={request_id!r}: full blocks of its row are not "
                "cached; use allocate_slots"
            )
        pool = self.block_pool
        if not pool.free_block_queue.num_free_blocks:
            return False
        # `pool.get_new_blocks(1)[0]`, inlined (hot path): the head of the free queue, evicted
        # from the prefix cache if it held a hash, with ref_cnt 1
        queue = pool.free_block_queue
        head = queue.fake_free_list_head
        block: KVCacheBlock = head.next_free_block  # type: ignore[assignment]
        nxt: KVCacheBlock = block.next_free_block  # type: ignore[assignment]
        head.next_free_block = nxt
        nxt.prev_free_block = head
        block.prev_free_block = block.next_free_block = None
        queue.num_free_blocks -= 1
        block_hash = block._block_hash
        if block_hash is not None:
            if type(block_hash) is DeferredBlocks:  # `DeferredBlocks.evict`, inlined
                block._block_hash = None
                block_hash.live -= 1
                if not block_hash.live:
                    block_hash.drop()
            else:
                pool.evict_cached_block(block)
        block.ref_cnt = 1
        row.append(block)
        self.req_to_block_ids[request_id].append(block.block_id)
        if self.check_invariants:
            self._check()
        return True

    def cache_decode_block(self, request: Request, packed_tokens: bytes) -> None:
        """Register the request's next full block (row index `num_cached_block`, not the first
        block) in the prefix cache, its tokens given packed as little-endian int32: what
        `allocate_slots(request, 1)` does when a decode fills a block, without reading the
        request's tokens (they may not be appended yet). Extends `request.block_hashes` when
        the hash is not there yet (eager hashing); with lazy hashing the block is deferred and
        its tokens kept until the request is freed."""
        rid = request.request_id
        num_cached = self.num_cached_block
        index = num_cached[rid]
        row = self.req_to_blocks[rid]
        if not 0 < index < len(row):
            raise InternalError(
                f"request_id={rid!r}: block {index} of a row of {len(row)} "
                "is not a decode block to cache"
            )
        lazy = self._lazy
        if lazy is not None:  # LazyHashes.defer_decode_block, its common case inlined
            if lazy.on_touch is not None:
                lazy.on_touch(request.block_hashes[0])
            tokens = lazy.decode_tokens.get(rid)
            if tokens is None:
                tokens = lazy.decode_tokens[rid] = {}
            tokens[index] = packed_tokens
            block = row[index]
            record = lazy.newest.get(rid)
            if (
                block._block_hash is None
                and not block.is_null
                and record is not None
                and record.tail
                and record.live
                and record.end == index
                and record.row is row
            ):
                block._block_hash = record  # nothing of its root registered since: join it
                record.end = index + 1
                record.live += 1
            else:
                lazy.defer_decode_block(request, row, index, packed_tokens)
        else:
            hashes = request.block_hashes
            if len(hashes) == index:
                hashes.append(self.hasher.next_hash(hashes[-1], packed_tokens, request.lora_name))
            self.block_pool.cache_block(row[index], hashes[index])
        num_cached[rid] = index + 1
        if self.check_invariants:
            self._check()

    def cache_decode_blocks(self, request: Request, num_full: int) -> None:
        """Cache the request's full blocks up to `num_full` (row indices `num_cached_block`
        to `num_full - 1`; the first block already cached), its tokens up to them in the
        request: what the `allocate_slots` calls of the decodes that filled them did, when
        nothing touched the prefix cache's group of their root in between."""
        rid = request.request_id
        row = self.req_to_blocks[rid]
        start = self.num_cached_block[rid]
        if not 0 < start < num_full <= len(row) or num_full * self.block_size > request.num_tokens:
            raise InternalError(
                f"request_id={rid!r}: blocks {start}..{num_full - 1} of a row "
                f"of {len(row)} ({request.num_tokens} tokens) are not decode "
                "blocks to cache"
            )
        self._cache_blocks(request, row, num_full)
        if self.check_invariants:
            self._check()

    def watch_lazy_groups(self, hook: Callable[[bytes | None], None]) -> bool:
        """Call `hook(root)` before anything reads or changes the deferred blocks of `root`
        (None: of every root); False (no hook set) without lazy hashing."""
        if self._lazy is None:
            return False
        self._lazy.on_touch = hook
        return True

    def _check(self) -> None:
        """The invariant checker over the manager this mixes into."""
        check_kv_cache_manager(cast("KVCacheManager", self))
