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
block's hash, a reset. Such operations call `LazyHashes.on_touch` first.

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

Tokens: a join needs the request's tokens up to the block's end (later hashing reads them);
the request's outputs are filled that far first, which never goes past what the step-by-step
path has appended by the frontier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.sim.fast_path import _Lazy

_AFTER_ALL = 1 << 62  # a running position past every lazy request


class PendingBlocks:
    """Lazy requests whose filled blocks join the prefix cache late, by root."""

    def __init__(self, manager: KVCacheManager,
                 fill_outputs: Callable[[_Lazy, int], None]) -> None:
        self.manager = manager
        self.block_size = manager.block_size
        self._fill_outputs = fill_outputs
        self.by_root: dict[bytes, list[_Lazy]] = {}  # running order within a root
        self.frontier_tick = 0
        self.frontier_seq = -1  # lazy requests ahead of this position have done tick's fill
        self._joining = False

    @classmethod
    def attach(cls, manager: KVCacheManager,
               fill_outputs: Callable[[_Lazy, int], None]) -> PendingBlocks | None:
        """One watching `manager`'s deferred blocks; None without lazy hashing (filled blocks
        are hashed at once there, so they must join at their step)."""
        pending = cls(manager, fill_outputs)
        return pending if manager.watch_lazy_groups(pending.on_touch) else None

    def clear(self) -> None:
        """No request joins late any more (every one brought up to date)."""
        for group in self.by_root.values():
            for lazy in group:
                lazy.root = None
        self.by_root = {}

    def add(self, lazy: _Lazy, root: bytes) -> None:
        """`lazy` (up to date: every block it has filled is cached) joins late from now on."""
        lazy.root = root
        group = self.by_root.get(root)
        if group is None:
            self.by_root[root] = [lazy]
        else:
            group.append(lazy)

    def remove(self, lazy: _Lazy) -> None:
        """`lazy` is no longer lazy (its blocks joined first)."""
        root = lazy.root
        if root is None:
            return
        group = self.by_root[root]
        if len(group) == 1:
            del self.by_root[root]
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
        if self._joining or not self.by_root:
            return
        if root is None:
            for r in list(self.by_root):
                self.join_root(r)
        elif root in self.by_root:
            self.join_root(root)

    def join_all(self) -> None:
        """Every late block filled by the frontier joins."""
        self.on_touch(None)

    def join_root(self, root: bytes) -> None:
        """The late blocks of `root`'s lazy requests filled by the frontier join, in the order
        the steps filled them."""
        group = self.by_root.get(root)
        if not group:
            return
        bs = self.block_size
        num_cached = self.manager.num_cached_block
        tick, seq = self.frontier_tick, self.frontier_seq
        self._joining = True
        try:
            if len(group) == 1:
                lazy = group[0]
                last = tick if lazy.seq < seq else tick - 1
                self._join(lazy, (lazy.offset + last + 1) // bs)
                return
            fills = []  # (tick, running position, block index, lazy): one per (tick, lazy)
            for lazy in group:
                last = tick if lazy.seq < seq else tick - 1
                for i in range(num_cached[lazy.rid], (lazy.offset + last + 1) // bs):
                    fills.append(((i + 1) * bs - 1 - lazy.offset, lazy.seq, i, lazy))
            fills.sort(key=_fill_order)
            for _, _, i, lazy in fills:
                self._join(lazy, i + 1)
        finally:
            self._joining = False

    def _join(self, lazy: _Lazy, num_full: int) -> None:
        """Cache `lazy`'s blocks up to `num_full`, its outputs filled to their end first."""
        if num_full <= self.manager.num_cached_block[lazy.rid]:
            return
        self._fill_outputs(lazy, num_full * self.block_size - lazy.prompt_len)
        self.manager.cache_decode_blocks(lazy.request, num_full)


def _fill_order(fill: tuple) -> tuple[int, int]:
    return fill[0], fill[1]
