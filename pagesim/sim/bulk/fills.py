"""Blocks that bulk decodes fill, cached later: a bulk request's filled blocks join the prefix
cache when something could tell, not at the step that fills them.

With deferred hashes (`pagesim.sim.deferred_hashes`) a block that a decode fills is not
hashed when `allocate_slots` caches it: it joins its request's `DeferredBlocks` record, in the
group of the request's root (the hash of its first block), and is hashed and registered when a
lookup of that root materializes the group. All that the join decides is the block's place
in its group's order (the order in which materialization registers blocks), and whether the
request's record is still its group's newest (a later block may join it, or needs a record
of its own). Nothing else reads the group until the next operation on it: a lookup of the
root, another block joining or deferred under it, a materialization, a read of a deferred
block's hash, a reset. Such operations call `DeferredHashTable.on_touch` first. (Evicting a
deferred block changes no other record's place, and drops only a record whose blocks are all
free, which a running request's blocks are not.)

So bulk decodes do not make an event of a block filling. A bulk request's full blocks are a
function of the tick: block i fills at the step whose token is its last slot, tick
`(i + 1) * block_size - 1 - offset`. Its blocks join the cache (`cache_decode_blocks`, all of
them in one call) when the request finishes or is brought up to date, and, when another
operation is about to touch its root's group, every bulk request of that root joins the blocks
it has filled by then, in the order the steps filled them (tick, then running order). The
*frontier* says how far "by then" goes: during the events of tick g at running position s,
blocks filled before tick g, and at tick g by requests ahead of s; after the events, everything
up to tick g. The group then holds exactly what it would hold had every block joined at its
step, in the same order; the request's `num_cached_block` catches up at the join (nothing
reads it for a bulk request before).

Tokens: later hashing reads a joined block's tokens. A join of all of a request's due blocks
in one call fills its outputs to their end first, which never goes past what the step-by-step
path has appended by the frontier; a join of one block (when several requests of a root have
due blocks, interleaved) hands its tokens packed from the synthetic token table instead, as
`cache_decode_block` takes them.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.sim.bulk.decodes import _BulkRequest
    from pagesim.sim.deferred_hashes import DeferredHashTable

_AFTER_ALL = 1 << 62  # a running position past every bulk request


class BulkFills:
    """Bulk requests whose filled blocks join the prefix cache later, by root.

    Each root keeps a heap of its bulk requests' next fills, (tick, running position, member):
    a touch pops only the fills that are due, in the order the steps made them, and a touch
    with none due costs one comparison. A root with a single bulk request (the common case:
    roots are shared only by system prompts, multi-turn histories and traces' hash ids) joins
    all its due blocks in one call.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        fill_outputs: Callable[[_BulkRequest, int], None],
        block_tokens: Callable[[_BulkRequest, int], bytes | None],
    ) -> None:
        self.manager = manager
        self.block_size = manager.block_size
        self._fill_outputs = fill_outputs
        self._block_tokens = block_tokens
        self.by_root: dict[bytes, list[_BulkRequest]] = {}  # running order within a root
        self.fills: dict[
            bytes, list[tuple[int, int, _BulkRequest]]
        ] = {}  # root -> heap of next fills
        self.frontier_tick = 0
        self.frontier_seq = -1  # bulk requests ahead of this position have done tick's fill
        self._joining = False

    @classmethod
    def attach(
        cls,
        manager: KVCacheManager,
        fill_outputs: Callable[[_BulkRequest, int], None],
        block_tokens: Callable[[_BulkRequest, int], bytes | None],
    ) -> BulkFills | None:
        """One watching `manager`'s deferred blocks; None without deferred hashes (filled blocks
        are hashed at once there, so they must join at their step). `fill_outputs(member, n)`
        appends a bulk request's outputs up to n; `block_tokens(member, i)` gives its block i's
        tokens packed (None: use the request's tokens)."""
        table = cast("DeferredHashTable | None", manager.deferred_hashes)  # `build_scheduler`'s
        if table is None:
            return None
        fills = cls(manager, fill_outputs, block_tokens)
        table.on_touch = fills.on_touch
        return fills

    def clear(self) -> None:
        """No request joins later any more (every one brought up to date)."""
        for group in self.by_root.values():
            for member in group:
                member.root = None
        self.by_root = {}
        self.fills = {}

    def add(self, member: _BulkRequest, root: bytes) -> None:
        """`member` (up to date: every block it has filled is cached) joins later from now on."""
        member.root = root
        fill = (self._next_fill(member), member.seq, member)
        group = self.by_root.get(root)
        if group is None:
            self.by_root[root] = [member]
            self.fills[root] = [fill]
        else:
            group.append(member)
            heappush(self.fills[root], fill)

    def remove(self, member: _BulkRequest) -> None:
        """`member` is no longer a bulk request (its blocks joined first). Its heap entry stays
        until popped (a removed request's entry is skipped)."""
        root = member.root
        if root is None:
            return
        group = self.by_root[root]
        if len(group) == 1:
            del self.by_root[root]
            del self.fills[root]
        else:
            group.remove(member)
        member.root = None

    def set_frontier(self, tick: int, seq: int = _AFTER_ALL) -> None:
        """Steps have filled every block up to `tick`, at tick `tick` those of bulk requests
        ahead of running position `seq` (default: all of them)."""
        self.frontier_tick, self.frontier_seq = tick, seq

    def on_touch(self, root: bytes | None) -> None:
        """`DeferredHashTable.on_touch`: the group of `root` (None: every group) is about to be read
        or changed; its waiting blocks join first."""
        if self._joining:
            return
        if root is None:
            for r in list(self.by_root):
                self.join_root(r)
        elif root in self.fills:
            self.join_root(root)

    def join_all(self) -> None:
        """Every waiting block filled by the frontier joins."""
        self.on_touch(None)

    def join_root(self, root: bytes) -> None:
        """The waiting blocks of `root`'s bulk requests filled by the frontier join, in the order
        the steps filled them."""
        heap = self.fills.get(root)
        if not heap or not self._due(heap[0]):
            return
        tick, seq = self.frontier_tick, self.frontier_seq
        self._joining = True
        try:
            group = self.by_root[root]
            if len(group) == 1:  # all its due blocks in one call
                member = group[0]
                last = tick if member.seq < seq else tick - 1
                target = (member.offset + last + 1) // self.block_size
                if target > self.manager.num_cached_block[member.rid]:  # (a due entry may be stale)
                    self._join(member, target)
                heap[:] = [(self._next_fill(member), member.seq, member)]
                return
            bs = self.block_size
            num_cached = self.manager.num_cached_block
            cache_decode_block = self.manager.cache_decode_block
            while heap and self._due(heap[0]):
                due, at, member = heappop(heap)
                if member.root != root:  # no longer a bulk request
                    continue
                i = num_cached[member.rid]  # the block it filled at tick `due`
                packed = self._block_tokens(member, i)
                if packed is None:
                    self._join(member, i + 1)
                else:  # one block, its tokens from the table
                    cache_decode_block(member.request, packed)
                heappush(heap, (due + bs, at, member))
        finally:
            self._joining = False

    def _due(self, fill: tuple[int, int, _BulkRequest]) -> bool:
        """Whether the steps have made `fill` (tick, running position, member) by the frontier."""
        tick = self.frontier_tick
        return fill[0] < tick or (fill[0] == tick and fill[1] < self.frontier_seq)

    def _next_fill(self, member: _BulkRequest) -> int:
        """The tick at which `member` fills its first block not cached yet."""
        return (self.manager.num_cached_block[member.rid] + 1) * self.block_size - 1 - member.offset

    def _join(self, member: _BulkRequest, num_full: int) -> None:
        """Cache `member`'s blocks up to `num_full`, its outputs filled to their end first."""
        self._fill_outputs(member, num_full * self.block_size - member.prompt_len)
        self.manager.cache_decode_blocks(member.request, num_full)
