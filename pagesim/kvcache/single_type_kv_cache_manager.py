"""Block tables of one KV cache group (vLLM's `SingleTypeKVCacheManager`, with its
`FullAttentionManager` and `SlidingWindowManager`).

The hybrid coordinator (`kv_cache_coordinator`) owns one manager per group over a shared
`BlockPool`. Each group caches its blocks under its own keys, the block hash followed by the
group id (vLLM's `BlockHashWithGroupId`): the same tokens are different K/V in different
groups, so a hit in one group says nothing about another.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Self

from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.block_pool import BlockPool
from pagesim.kvcache.kv_cache_spec import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec
from pagesim.kvcache.sliding_window import SlidingWindow
from pagesim.request import Request


def _cached_in_all(
    pool: BlockPool, suffixes: Sequence[bytes]
) -> Callable[[bytes], list[KVCacheBlock] | None]:
    """The lookup of groups searched as one: a block hash -> the cached block in each group
    (by key suffix), or None if any misses."""
    get_cached_block = pool.get_cached_block

    def lookup(block_hash: bytes) -> list[KVCacheBlock] | None:
        found: list[KVCacheBlock] = []
        for suffix in suffixes:
            block = get_cached_block(block_hash + suffix)
            if block is None:
                return None
            found.append(block)
        return found

    return lookup


@dataclass(eq=False)
class SingleTypeKVCacheManager:
    """One group's rows: `req_to_blocks` (blocks in table order, null where a window freed
    them), `req_to_block_ids` (the same row as ids, kept in step) and `num_cached_block`
    (leading entries already registered in the prefix cache, or null)."""

    is_full_attention: ClassVar[bool] = True

    kv_cache_spec: KVCacheSpec
    block_pool: BlockPool
    kv_cache_group_id: int
    enable_caching: bool

    def __post_init__(self) -> None:
        self.block_size = self.kv_cache_spec.block_size
        # Appended to a block hash: the key this group caches the block under.
        self.hash_suffix = self.kv_cache_group_id.to_bytes(2, "big")
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}

    # ---- window arithmetic (none for full attention) ------------------------------------
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next query (0: all stay visible)."""
        return 0

    def cap_admission_blocks(self, num_blocks: int) -> int:
        """The recycling-aware admission cap (sliding window only)."""
        return num_blocks

    def peak_blocks(self, num_tokens: int) -> int:
        """Most blocks one request of `num_tokens` slots holds in this group at once."""
        return -(-num_tokens // self.block_size)

    # ---- lookup --------------------------------------------------------------------------
    @classmethod
    def find_longest_cache_hit(
        cls, managers: Sequence[Self], block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[list[list[KVCacheBlock]], int]:
        """Full attention: the longest run of leading blocks cached in every one of
        `managers` (groups of one spec), at most `max_length` tokens; per group, and its
        length in tokens. Hashes chain, so the first miss ends the run."""
        lookup = _cached_in_all(managers[0].block_pool, [m.hash_suffix for m in managers])
        hit: list[list[KVCacheBlock]] = [[] for _ in managers]
        for i in range(max_length // managers[0].block_size):
            found = lookup(block_hashes[i])
            if found is None:
                break
            for row, block in zip(hit, found, strict=True):
                row.append(block)
        return hit, len(hit[0]) * managers[0].block_size

    # ---- allocation ----------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Free blocks that `num_tokens` slots would take from the pool now: new blocks, plus
        hit blocks that are eviction candidates (they leave the free queue). Changes nothing."""
        num_required = -(-num_tokens // self.block_size)
        if apply_admission_cap:
            num_required = self.cap_admission_blocks(num_required)
        row = self.req_to_blocks.get(request_id)
        if row is not None:  # running: no new prefix hits
            return max(num_required - len(row), 0)
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(num_required - max(num_skipped, len(new_computed_blocks)), 0)
        num_evictable = sum(
            1 for b in new_computed_blocks[num_skipped:] if b.ref_cnt == 0 and not b.is_null
        )
        return num_new + num_evictable

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
    ) -> None:
        """Start a new request's row with its prefix hit: the blocks a window already skips
        become null, the others are touched (ref_cnt + 1, out of the free queue)."""
        num_skipped = self.get_num_skipped_tokens(num_local_computed_tokens) // self.block_size
        kept = new_computed_blocks[num_skipped:]
        self.block_pool.touch(kept)
        row = [self.block_pool.null_block] * min(num_skipped, len(new_computed_blocks))
        row.extend(kept)
        self.req_to_blocks[request_id] = row
        self.req_to_block_ids[request_id] = [b.block_id for b in row]
        self.num_cached_block[request_id] = len(row)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the row to `num_tokens` slots; the caller has checked the free blocks."""
        row = self.req_to_blocks.get(request_id)
        if row is None:
            row = self.req_to_blocks[request_id] = []
            self.req_to_block_ids[request_id] = []
            self.num_cached_block[request_id] = 0
        num_new = -(-num_tokens // self.block_size) - len(row)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        row.extend(new_blocks)
        self.req_to_block_ids[request_id].extend(b.block_id for b in new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Register the row's full blocks among the first `num_tokens` tokens (the request's
        `block_hashes` must cover them) under this group's keys."""
        rid = request.request_id
        num_cached = self.num_cached_block[rid]
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        keys = [h + self.hash_suffix for h in request.block_hashes[num_cached:num_full]]
        self.block_pool.cache_full_blocks(
            self.req_to_blocks[rid][num_cached:num_full], keys, 0, len(keys)
        )
        self.num_cached_block[rid] = num_full

    # ---- freeing -------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        """Release the row, tail first (its last blocks are evicted first)."""
        row = self.req_to_blocks.pop(request_id, None)
        self.req_to_block_ids.pop(request_id, None)
        self.num_cached_block.pop(request_id, None)
        if row:
            self.block_pool.free_blocks(reversed(row))

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> int:
        """Free the blocks no future query can see (none for full attention); how many."""
        return 0


@dataclass(eq=False)
class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: rows only grow; a hit is a run of leading cached blocks."""

    kv_cache_spec: FullAttentionSpec


@dataclass(eq=False)
class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding window: blocks that fell out of the window are freed and their entries become
    the null block; a hit needs only the window's blocks before the next query cached.
    `max_num_batched_tokens` and `max_model_len` set the window's admission cap."""

    is_full_attention: ClassVar[bool] = False

    kv_cache_spec: SlidingWindowSpec
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        spec = self.kv_cache_spec
        self.window = SlidingWindow(
            spec.sliding_window, spec.block_size, self.max_num_batched_tokens, self.max_model_len
        )

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.window.sliding_window + 1)

    def cap_admission_blocks(self, num_blocks: int) -> int:
        return self.window.cap_admission_blocks(num_blocks)

    def peak_blocks(self, num_tokens: int) -> int:
        return min(-(-num_tokens // self.block_size), self.window.peak_blocks)

    @classmethod
    def find_longest_cache_hit(
        cls, managers: Sequence[Self], block_hashes: Sequence[bytes], max_length: int
    ) -> tuple[list[list[KVCacheBlock]], int]:
        """The window's hit (`SlidingWindow.find_longest_cache_hit`) over the blocks cached in
        every group, as one table prefix per group."""
        first = managers[0]
        pool = first.block_pool
        found = first.window.find_longest_cache_hit(
            _cached_in_all(pool, [m.hash_suffix for m in managers]),
            [pool.null_block] * len(managers),
            block_hashes,
            max_length // first.block_size,
        )
        hit = [list(row) for row in zip(*found, strict=True)] if found else [[] for _ in managers]
        return hit, len(found) * first.block_size

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> int:
        row = self.req_to_blocks.get(request_id)
        if not row:
            return 0
        return self.window.remove_skipped_blocks(
            self.block_pool, row, self.req_to_block_ids[request_id], num_computed_tokens
        )
