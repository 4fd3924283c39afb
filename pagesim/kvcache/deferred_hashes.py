"""Deferred hashes: what the allocator asks of an owner that hashes cached blocks later.

Hashing every full block as it fills is most of the cost of prefix caching in a simulation,
and most blocks are never looked up. An owner of deferred hashes (the simulator's
`pagesim.sim.deferred_hashes.DeferredHashTable`) lets the manager cache a request's blocks
after its first without hashing them: such a block holds a *placeholder* instead of its hash,
bytes that are no key of the pool's hash map (real hashes are digests of 16 bytes or more), so
that the pool treats it as cached (freed to the tail, dropped when handed out again: its
placeholder then goes to `BlockPool.handed_out_placeholders`, which the owner reads when it
next acts) and the owner hashes and registers it before any lookup that could see it. With an owner
the manager's decisions are the ones eager hashing makes; without one (the default, and the GPU
replay) nothing is deferred and every hashed block is in the map.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pagesim.kvcache.block import KVCacheBlock
    from pagesim.kvcache.block_pool import BlockPool
    from pagesim.kvcache.hashing import BlockHasher
    from pagesim.request import Request


class DeferredHashes(Protocol):
    """The calls the manager and the pool make; the owner keeps the deferred blocks."""

    def defer(
        self, request: Request, row: list[KVCacheBlock], start: int, end: int, tokens: bytes | None
    ) -> None:
        """Cache `row[start:end]` (`start` >= 1: the first block is registered by the caller),
        deferred; blocks already cached or null are skipped. `tokens`: those of the one block
        `row[start]` packed as little-endian int32, when they are not in the request yet (None:
        in the request)."""

    def lookup(self, request: Request) -> list[KVCacheBlock]:
        """`KVCacheManager.get_computed_blocks`' hit, every deferred block it could see
        registered first."""

    def forget_request(self, request_id: str) -> None:
        """The request is freed."""

    def clear(self) -> None:
        """The pool drops every cached hash."""

    def check(self, deferred: list[KVCacheBlock]) -> None:
        """Invariants, given the pool's blocks that hold bytes no key of the map has: each
        holds a placeholder of the owner's."""


# What the manager takes to build its owner, from its pool and hasher.
DeferredHashesFactory = Callable[["BlockPool", "BlockHasher"], DeferredHashes]
