"""Decode blocks the fast path caches late: a lazy request's filled blocks join the prefix
cache when something could tell, not at the step that fills them.

With lazy hashing (`pagesim.kvcache.lazy_hashes`) a block that a decode fills is not hashed
when `allocate_slots` caches it: it joins its request's `DeferredBlocks` record, in the group
of the request's root (the hash of its first block), and is hashed and registered when a
lookup of that root materializes the group. All that the join decides is the block's place
in its group's order (the order in which materialization registers blocks), and whether the
request's record is still its group's newest (a later block may join it, or needs a record
of its own). Nothing else reads the group until the next operation on it: a lookup of the
root, another block joining or deferred under it, a materialization, a read of a deferred
block's hash, a reset. Such operations call `LazyHashes.on_touch` first. (Evicting a deferred
block changes no other record's place, and drops only a record whose blocks are all free,
which a running request's blocks are not.)

So the decode fast path does not make an event of a block filling. A lazy request's full
blocks are a function of the tick: block i fills at the step whose token is its last slot,
tick `(i + 1) * block_size - 1 - offset`. Its blocks join the cache (`cache_decode_blocks`,
all of them in one call) when the request finishes or is brought up to date, and, when
another operation is about to touch its root's group, every lazy request of that root joins
the blocks it has filled by then, in the order the steps filled them (tick, then running
order). The *frontier* says how far "by then" goes: during the events of tick g at running
position s, blocks filled before tick g, and at tick g by requests ahead of s; after the
events, everything up to tick g. The group then holds exactly what it would hold had every
block joined at its step, in the same order; the request's `num_cached_block` catches up at
the join (nothing reads it for a lazy request before).

Tokens: later hashing reads a joined block's tokens. A join of all of a request's due blocks
in one call fills its outputs to their end first, which never goes past what the step-by-step
path has appended by the frontier; a join of one block (when several requests of a root have
due blocks, interleaved) hands its tokens packed from the synthetic token table instead, as
`cache_decode_block` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.sim.fast_path import _Lazy

_AFTER_ALL = 1 << 62  # a running position past every lazy request


class PendingBlocks:
    """Lazy requests whose filled blocks join the prefix cache late, by root.

    Each root keeps a heap of its lazy requests' next fills, (tick, running position, lazy):
    a touch pops only the fills that are due, in the order the steps made them, and a touch
    with none due costs one comparison. A root with a single lazy request (the common case:
    roots are shared only by system prompts, multi-turn histories and traces' hash ids) joins
    all its due blocks in one call.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        fill_outputs: Callable[[_Lazy, int], None],
        block_tokens: Callable[[_Lazy, int], bytes | None],
    ) -> None:
        self.manager = manager
        self.block_size = manager.block_size
        self._fill_outputs = fill_outputs
        self._block_tokens = block_tokens
        self.by_root: dict[bytes, list[_Lazy]] = {}  # running order within a root
        self.fills: dict[bytes, list[tuple[int, int, _Lazy]]] = {}  # root -> heap of next fills
        self.frontier_tick = 0
        self.frontier_seq = -1  # lazy requests ahead of this position have done tick's fill
        self._joining = False

    @classmethod
    def attach(
        cls,
        manager: KVCacheManager,
        fill_outputs: Callable[[_Lazy, int], None],
        block_tokens: Callable[[_Lazy, int], bytes | None],
    ) -> PendingBlocks | None:
        """One watching `manager`'s deferred blocks; None without lazy hashing (filled blocks
        are hashed at once there, so they must join at their step). `fill_outputs(lazy, n)`
        appends a lazy request's outputs up to n; `block_tokens(lazy, i)` gives its block i's
        tokens packed (None: use the request's tokens)."""
        pending = cls(manager, fill_outputs, block_tokens)
        return pending if manager.watch_lazy_groups(pending.on_touch) else None

    def clear(self) -> None:
        """No request joins late any more (every one brought up to date)."""
        for group in self.by_root.values():
            for lazy in group:
                lazy.root = None
        self.by_root = {}
        self.fills = {}

    def add(self, lazy: _Lazy, root: bytes) -> None:
        """`lazy` (up to date: every block it has filled is cached) joins late from now on."""
        lazy.root = root
        fill = (self._next_fill(lazy), lazy.seq, lazy)
        group = self.by_root.get(root)
        if group is None:
            self.by_root[root] = [lazy]
            self.fills[root] = [fill]
        else:
            group.append(lazy)
            heappush(self.fills[root], fill)

    def remove(self, lazy: _Lazy) -> None:
        """`lazy` is no longer lazy (its blocks joined first). Its heap entry stays until
        popped (a removed request's entry is skipped)."""
        root = lazy.root
        if root is None:
            return
        group = self.by_root[root]
        if len(group) == 1:
            del self.by_root[root]
            del self.fills[root]
        else:
            group.remove(lazy)
        lazy.root = None

    def set_frontier(self, tick: int, seq: int = _AFTER_ALL) -> None:
        """Steps have filled every block up to `tick`, at tick `tick` those of lazy requests
        ahead of running position `seq` (default: all of them)."""
        self.frontier_tick, self.frontier_seq = tick, seq

    def on_touch(self, root: bytes | None) -> None:
        """`LazyHashes.on_touch`: the group of `root` (None: every group) is about to be read
        or changed; its late blocks join first."""
        if self._joining:
            return
        if root is None:
            for r in list(self.by_root):
                self.join_root(r)
        elif root in self.fills:
            self.join_root(root)

    def join_all(self) -> None:
        """Every late block filled by the frontier joins."""
        self.on_touch(None)

    def join_root(self, root: bytes) -> None:
        """The late blocks of `root`'s lazy requests filled by the frontier join, in the order
        the steps filled them."""
        heap = self.fills.get(root)
        if not heap or not self._due(heap[0]):
            return
        tick, seq = self.frontier_tick, self.frontier_seq
        self._joining = True
        try:
            group = self.by_root[root]
            if len(group) == 1:  # all its due blocks in one call
                lazy = group[0]
                last = tick if lazy.seq < seq else tick - 1
                target = (lazy.offset + last + 1) // self.block_size
                if target > self.manager.num_cached_block[lazy.rid]:  # (a due entry may be stale)
                    self._join(lazy, target)
                heap[:] = [(self._next_fill(lazy), lazy.seq, lazy)]
                return
            bs = self.block_size
            num_cached = self.manager.num_cached_block
            cache_decode_block = self.manager.cache_decode_block
            while heap and self._due(heap[0]):
                due, at, lazy = heappop(heap)
                if lazy.root != root:  # no longer lazy
                    continue
                i = num_cached[lazy.rid]  # the block it filled at tick `due`
                packed = self._block_tokens(lazy, i)
                if packed is None:
                    self._join(lazy, i + 1)
                else:  # one block, its tokens from the table
                    cache_decode_block(lazy.request, packed)
                heappush(heap, (due + bs, at, lazy))
        finally:
            self._joining = False

    def _due(self, fill: tuple[int, int, _Lazy]) -> bool:
        """Whether the steps have made `fill` (tick, running position, lazy) by the frontier."""
        tick = self.frontier_tick
        return fill[0] < tick or (fill[0] == tick and fill[1] < self.frontier_seq)

    def _next_fill(self, lazy: _Lazy) -> int:
        """The tick at which `lazy` fills its first block not cached yet."""
        return (self.manager.num_cached_block[lazy.rid] + 1) * self.block_size - 1 - lazy.offset

    def _join(self, lazy: _Lazy, num_full: int) -> None:
        """Cache `lazy`'s blocks up to `num_full`, its outputs filled to their end first."""
        self._fill_outputs(lazy, num_full * self.block_size - lazy.prompt_len)
        self.manager.cache_decode_blocks(lazy.request, num_full)
