"""Deferred hashes (`pagesim.kvcache.deferred_hashes`): a full block after a request's first
one is hashed and entered in the pool's hash map only when a lookup could see it.

Why it is exact. A block's hash chains every token before it (`pagesim.kvcache.hashing`), so
block i of request B can equal block j of request A only if i == j and the two requests' first
blocks have the same hash, their *root*. The first block of every request is hashed and
registered as before; its later blocks are recorded as deferred under their root (a
`DeferredBlocks` record, in registration order; each block holds its record's placeholder).
A prefix lookup first computes the looking request's root and
registers every deferred block of that root, in the order in which eager registration would
have entered them; after that the hash map holds, for every hash the lookup can ask for,
exactly the blocks that eager hashing would hold there, in the same order (the
first-registered one wins). A deferred block that is handed out again before that simply
stops being cached, as its hash would have been dropped. A reader of the whole map or of a
block's hash calls `materialize_all` first to read the eager values (the map's key order
aside: keys of deferred blocks enter it when they are registered).

`Request.block_hashes` grows only as far as lookups and registrations need: it is always a
prefix of the eager list (equal values), not necessarily the whole of it.

Tokens: a deferred block is hashed from its request's tokens, or, for a decode block cached by
`cache_decode_block` before its tokens reach the request (bulk decodes), from the packed tokens
kept for it until the request is freed (by then its tokens are there).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from pagesim.errors import InternalError
from pagesim.kvcache.invariants import require

if TYPE_CHECKING:
    from pagesim.kvcache.block import KVCacheBlock
    from pagesim.kvcache.block_pool import BlockPool
    from pagesim.kvcache.hashing import BlockHasher
    from pagesim.request import Request


class DeferredBlocks:
    """Blocks `row[start:end]` of `request`, cached but not hashed yet: each of them that holds
    `placeholder` (`live` of them) is still deferred. `tail`: no record of its root was made
    after it (so a block registered next may join it)."""

    __slots__ = ("request", "row", "start", "end", "root", "placeholder", "live", "tail")

    def __init__(
        self, request: Request, row: list[KVCacheBlock], start: int, root: bytes, serial: int
    ) -> None:
        self.request = request
        self.row = row
        self.start = self.end = start
        self.root = root
        self.placeholder = serial.to_bytes(8, "little")  # 8 bytes: never a digest
        self.live = 0
        self.tail = False


class DeferredHashTable:
    """The deferred blocks of one pool, by root (see the module docstring); the manager's
    `DeferredHashes`."""

    def __init__(self, pool: BlockPool, hasher: BlockHasher) -> None:
        self.pool = pool
        self.hasher = hasher
        # root -> its deferred records in registration order (dict: O(1) removal)
        self.groups: dict[bytes, dict[DeferredBlocks, None]] = {}
        self.by_placeholder: dict[bytes, DeferredBlocks] = {}  # records with live blocks
        self._serial = 0
        self.newest: dict[str, DeferredBlocks] = {}  # request id -> its last record
        self.decode_tokens: dict[str, dict[int, bytes]] = {}  # request id -> block -> packed
        # Called with a root (None: every root) before its group is read or changed, by bulk
        # decodes, whose filled blocks join later (`pagesim.sim.bulk.fills`).
        self.on_touch: Callable[[bytes | None], None] | None = None

    # ---- DeferredHashes -------------------------------------------------------------------
    def defer(
        self, request: Request, row: list[KVCacheBlock], start: int, end: int, tokens: bytes | None
    ) -> None:
        root = request.block_hashes[0]
        if self.on_touch is not None:
            self.on_touch(root)
        self._settle()
        rid = request.request_id
        if tokens is not None:
            kept = self.decode_tokens.get(rid)
            if kept is None:
                kept = self.decode_tokens[rid] = {}
            kept[start] = tokens
            block = row[start]
            if block.block_hash is not None or block.is_null:
                return
        record = self.newest.get(rid)
        if (
            record is None
            or not record.live
            or not record.tail
            or record.end != start
            or record.row is not row
        ):  # something of its root was registered since: a record of its own
            record = DeferredBlocks(request, row, start, root, self._serial)
            self._serial += 1
        placeholder = record.placeholder
        count = 0
        for block in row[start:end]:
            if block.block_hash is None and not block.is_null:
                block.block_hash = placeholder
                count += 1
        record.end = end
        if count:
            if not record.live:
                self.by_placeholder[placeholder] = record
                groups = self.groups
                group = groups.get(root)
                if group is None:
                    group = groups[root] = {}
                elif group:
                    next(reversed(group)).tail = False
                group[record] = None
                record.tail = True
                self.newest[rid] = record
            record.live += count

    def lookup(self, request: Request) -> list[KVCacheBlock]:
        max_num_blocks = (request.num_tokens - 1) // self.hasher.block_size
        if max_num_blocks < 1:
            return []
        hashes = request.block_hashes
        if not hashes:
            self.hasher.extend(request, 1)
        self.materialize(hashes[0])
        cache = self.pool.cached_block_hash_to_block
        hit: list[KVCacheBlock] = []
        for i in range(max_num_blocks):
            if i == len(hashes):
                self.chain(request, i + 1)
            found = cache.get(hashes[i])
            if found is None:
                break
            hit.append(next(iter(found.values())) if isinstance(found, dict) else found)
        return hit

    def _settle(self) -> None:
        """Account for the deferred blocks the pool has handed out since the last call (the
        pool only notes their placeholders: nothing reads the records in between)."""
        handed_out = self.pool.handed_out_placeholders
        if not handed_out:
            return
        by_placeholder = self.by_placeholder
        for placeholder in handed_out:
            record = by_placeholder[placeholder]
            record.live -= 1
            if not record.live:  # none of its blocks is deferred any more: leave its group
                del by_placeholder[placeholder]
                group = self.groups[record.root]
                del group[record]
                if not group:
                    del self.groups[record.root]
        handed_out.clear()

    def forget_request(self, request_id: str) -> None:
        """The request's tokens are all in it now; drop what was kept for it."""
        self.newest.pop(request_id, None)
        self.decode_tokens.pop(request_id, None)

    def clear(self) -> None:
        if self.on_touch is not None:
            self.on_touch(None)
        self.pool.handed_out_placeholders.clear()
        for group in self.groups.values():
            for record in group:
                record.live = 0
        self.groups.clear()
        self.by_placeholder.clear()

    def check(self, deferred: list[KVCacheBlock]) -> None:
        """Every deferred block is in its record's range, every record in its root's group,
        counting its deferred blocks (registers nothing)."""
        self._settle()
        counts = Counter(b.block_hash for b in deferred)
        grouped = 0
        for root, group in self.groups.items():
            require(len(group) > 0, "empty group of deferred blocks")
            last = next(reversed(group))
            for record in group:
                grouped += 1
                require(not record.tail or record is last, "a tail record is not its group's last")
                require(record.root == root, "record in a foreign group")
                live = counts[record.placeholder]
                require(
                    record.live == live > 0,
                    f"deferred record counts {record.live} blocks, {live} hold its placeholder",
                )
                require(self.by_placeholder.get(record.placeholder) is record, "lost record")
                inside = sum(
                    1
                    for b in record.row[record.start : record.end]
                    if b.block_hash is record.placeholder
                )
                require(inside == record.live, "deferred block outside its record's range")
        require(
            grouped == len(counts) == len(self.by_placeholder),
            "blocks hold bytes that are neither a mapped hash nor a live record's placeholder",
        )

    # ---- registration ---------------------------------------------------------------------
    def materialize(self, root: bytes) -> None:
        """Hash and register every deferred block of `root`, in registration order."""
        if self.on_touch is not None:
            self.on_touch(root)
        self._settle()
        group = self.groups.pop(root, None)
        if group is None:
            return
        cache_block = self.pool.cache_block
        for record in group:
            request, row, placeholder = record.request, record.row, record.placeholder
            self.chain(request, record.end)
            hashes = request.block_hashes
            for i in range(record.start, record.end):
                block = row[i]
                if block.block_hash is placeholder:
                    block.block_hash = None
                    cache_block(block, hashes[i])
            record.live = 0
            del self.by_placeholder[placeholder]

    def hash_of(self, block: KVCacheBlock) -> bytes | None:
        """`block.block_hash` as eager hashing has it: a deferred block's root is registered
        first (for readers of hashes)."""
        self._settle()
        record = self.by_placeholder.get(block.block_hash)  # type: ignore[arg-type]
        if record is not None:
            self.materialize(record.root)
        return block.block_hash

    def materialize_all(self) -> None:
        """Register every deferred block (for readers of the whole map or of blocks' hashes)."""
        if self.on_touch is not None:
            self.on_touch(None)
        while self.groups:
            self.materialize(next(iter(self.groups)))

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
