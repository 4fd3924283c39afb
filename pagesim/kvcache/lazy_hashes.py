"""Lazy prefix-cache registration: a full block after a request's first one is hashed and
entered in the pool's hash map only when something could observe it.

Why it is exact. A block's hash chains every token before it (`pagesim.kvcache.hashing`), so
block i of request B can equal block j of request A only if i == j and the two requests' first
blocks have the same hash, their *root*. The first block of every request is hashed and
registered as before; its later blocks are recorded as deferred under their root (a
`DeferredBlocks` record, in registration order, and each block's `_block_hash` points at it).
A prefix lookup first computes the looking request's root and registers every deferred block
of that root, in the order in which eager registration would have entered them; after that
the hash map holds, for every hash the lookup can ask for, exactly the blocks that eager
hashing would hold there, in the same order (the first-registered one wins). A deferred block
that is handed out again before that simply stops being cached, as its hash would have been
dropped. Reading `KVCacheBlock.block_hash` or `BlockPool.cached_block_hash_to_block` registers
what they could show first, so they read the eager values (the map's key order aside: keys of
deferred blocks enter it when they are registered).

`Request.block_hashes` grows only as far as lookups and registrations need: it is always a
prefix of the eager list (equal values), not necessarily the whole of it.

Tokens: a deferred block is hashed from its request's tokens, or, for a decode block cached by
`cache_decode_block` before its tokens reach the request (the simulator's decode fast path),
from the packed tokens kept for it until the request is freed (by then its tokens are there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pagesim.errors import InternalError

if TYPE_CHECKING:
    from pagesim.kvcache.block import KVCacheBlock
    from pagesim.kvcache.block_pool import BlockPool
    from pagesim.kvcache.hashing import BlockHasher
    from pagesim.request import Request


class DeferredBlocks:
    """Blocks `row[start:end]` of `request`, cached but not hashed yet: each of them whose
    `_block_hash` is this record (`live` of them) is still deferred. `tail`: no record of its
    root was made after it (so a block registered next may join it)."""

    __slots__ = ("owner", "request", "row", "start", "end", "root", "live", "tail")

    def __init__(
        self, owner: LazyHashes, request: Request, row: list[KVCacheBlock], start: int, root: bytes
    ) -> None:
        self.owner = owner
        self.request = request
        self.row = row
        self.start = self.end = start
        self.root = root
        self.live = 0
        self.tail = False

    def resolve(self, block: KVCacheBlock) -> bytes | None:
        """`block`'s hash, registering its root's deferred blocks first."""
        self.owner.materialize(self.root)
        h = block._block_hash
        return h if h is None or isinstance(h, bytes) else None

    def evict(self, block: KVCacheBlock) -> None:
        """`block` is handed out again: it is no longer cached."""
        block._block_hash = None
        self.live -= 1
        if not self.live:
            self.drop()

    def drop(self) -> None:
        """None of its blocks is deferred any more: leave its root's group."""
        groups = self.owner.groups
        group = groups[self.root]
        del group[self]
        if not group:
            del groups[self.root]


class LazyHashes:
    """The deferred blocks of one pool, by root (see the module docstring)."""

    def __init__(self, pool: BlockPool, hasher: BlockHasher) -> None:
        self.pool = pool
        self.hasher = hasher
        # root -> its deferred records in registration order (dict: O(1) removal)
        self.groups: dict[bytes, dict[DeferredBlocks, None]] = {}
        self.newest: dict[str, DeferredBlocks] = {}  # request id -> its last record
        self.decode_tokens: dict[str, dict[int, bytes]] = {}  # request id -> block -> packed
        # Called with a root (None: every root) before its group is read or changed, by the
        # simulator's decode fast path, which joins blocks late (`pagesim.sim.pending_blocks`).
        self.on_touch: Callable[[bytes | None], None] | None = None

    def defer(
        self, request: Request, row: list[KVCacheBlock], start: int, end: int, root: bytes
    ) -> None:
        """Cache `row[start:end]` (blocks 1... of the request whose first block hashes to
        `root`), deferred: blocks already cached or null are skipped, as registration does."""
        if self.on_touch is not None:
            self.on_touch(root)
        rid = request.request_id
        groups = self.groups
        group = groups.get(root)
        record = self.newest.get(rid)
        if (
            record is None
            or not record.live
            or not record.tail
            or record.end != start
            or record.row is not row
        ):
            record = DeferredBlocks(self, request, row, start, root)
        count = 0
        for block in row[start:end]:
            if block._block_hash is None and not block.is_null:
                block._block_hash = record
                count += 1
        record.end = end
        if count:
            if not record.live:
                if group is None:
                    group = groups[root] = {}
                elif group:
                    next(reversed(group)).tail = False
                group[record] = None
                record.tail = True
                self.newest[rid] = record
            record.live += count

    def defer_decode_block(
        self, request: Request, row: list[KVCacheBlock], index: int, packed_tokens: bytes
    ) -> None:
        """`defer` of the one block `row[index]`, its tokens given packed (little-endian
        int32) because they may not be in the request yet."""
        if self.on_touch is not None:
            self.on_touch(request.block_hashes[0])
        rid = request.request_id
        tokens = self.decode_tokens.get(rid)
        if tokens is None:
            tokens = self.decode_tokens[rid] = {}
        tokens[index] = packed_tokens
        block = row[index]
        if block._block_hash is not None or block.is_null:
            return
        record = self.newest.get(rid)
        if (
            record is not None
            and record.tail
            and record.live
            and record.end == index
            and record.row is row
        ):  # nothing of its root registered since: join it
            block._block_hash = record
            record.end = index + 1
            record.live += 1
            return
        self.defer(request, row, index, index + 1, request.block_hashes[0])

    def lookup(self, request: Request) -> list[KVCacheBlock]:
        """`KVCacheManager.get_computed_blocks`' hit (full attention): the request's root's
        deferred blocks are registered first, and its hashes computed only as far as it hits."""
        max_num_blocks = (request.num_tokens - 1) // self.hasher.block_size
        if max_num_blocks < 1:
            return []
        hashes = request.block_hashes
        if not hashes:
            self.hasher.extend(request, 1)
        if self.on_touch is not None:
            self.on_touch(hashes[0])
        if hashes[0] in self.groups:
            self._materialize(hashes[0])
        cache = self.pool._cached
        hit: list[KVCacheBlock] = []
        for i in range(max_num_blocks):
            if i == len(hashes):
                self.chain(request, i + 1)
            found = cache.get(hashes[i])
            if found is None:
                break
            hit.append(next(iter(found.values())) if isinstance(found, dict) else found)
        return hit

    def forget_request(self, request_id: str) -> None:
        """The request is freed: its tokens are all in it now; drop what was kept for it."""
        self.newest.pop(request_id, None)
        self.decode_tokens.pop(request_id, None)

    def clear(self) -> None:
        """Forget every deferred block (the pool drops every cached hash)."""
        if self.on_touch is not None:
            self.on_touch(None)
        for group in self.groups.values():
            for record in group:
                record.live = 0
        self.groups.clear()

    def materialize(self, root: bytes) -> None:
        """Hash and register every deferred block of `root`, in registration order."""
        if self.on_touch is not None:
            self.on_touch(root)
        self._materialize(root)

    def _materialize(self, root: bytes) -> None:
        group = self.groups.pop(root, None)
        if group is None:
            return
        register = self.pool._register
        for record in group:
            request, row = record.request, record.row
            self.chain(request, record.end)
            hashes = request.block_hashes
            for i in range(record.start, record.end):
                block = row[i]
                if block._block_hash is record:
                    block._block_hash = None
                    register(block, hashes[i])
            record.live = 0

    def materialize_all(self) -> None:
        """Register every deferred block (for readers of the whole map)."""
        if self.on_touch is not None:
            self.on_touch(None)
        while self.groups:
            self._materialize(next(iter(self.groups)))

    def chain(self, request: Request, num_blocks: int) -> None:
        """Extend `request.block_hashes` to `num_blocks` hashes, from its tokens or the
        packed tokens kept for its decode blocks."""
        hashes = request.block_hashes
        if len(hashes) >= num_blocks:
            return
        packed = self.decode_tokens.get(request.request_id)
        hasher = self.hasher
        while len(hashes) < num_blocks:
            i = len(hashes)
            tokens = packed.get(i) if packed and i else None
            if tokens is not None:
                hashes.append(hasher.next_hash(hashes[-1], tokens, request.lora_name))
                continue
            stop = num_blocks
            if packed:
                later = [k for k in packed if i < k < stop]
                if later:
                    stop = min(later)
            hasher.extend(request, stop)
            if len(hashes) < stop:
                raise InternalError(
                    f"request_id={request.request_id!r}: block {len(hashes)} "
                    "is cached but its tokens are unknown"
                )
