"""The KV cache groups of a hybrid model over one block pool (vLLM's
`HybridKVCacheCoordinator`).

Every operation runs over the groups in group order: allocation pops each group's new blocks
from the pool's head in turn, freeing releases group 0's row first (each row tail first), so
block ids and the free-queue order follow vLLM's.

The prefix hit is the longest prefix that every group can serve. Groups of one spec are
looked up together (a block must be cached in all of them), full attention first: its hit is
downward-closed (any shorter prefix also hits), so it bounds the others, and each other spec
either accepts the current length or lowers it. The lengths only fall, so the loop reaches a
fixed point; with one full-attention spec and one other, one pass suffices:

    full attention   [b1 b2 b3 b4 b5]      hits 5 blocks
    sliding window   [nul nul b8 b9]       searched within 5 blocks, hits 4
    result           4 blocks: full attention trimmed to [b1 b2 b3 b4]
"""

from __future__ import annotations

from typing import NamedTuple

from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.block_pool import BlockPool
from pagesim.kvcache.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from pagesim.kvcache.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
    SlidingWindowManager,
)
from pagesim.request import Request


class SpecGroup(NamedTuple):
    """KV cache groups of one spec, looked up as one."""

    spec: KVCacheSpec
    group_ids: list[int]


class HybridKVCacheCoordinator:
    """One `SingleTypeKVCacheManager` per KV cache group, all over `block_pool`."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        block_pool: BlockPool,
        enable_caching: bool,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        self.kv_cache_config = kv_cache_config
        self.block_pool = block_pool
        self.block_size = kv_cache_config.block_size
        managers: list[SingleTypeKVCacheManager] = []
        for i, group in enumerate(kv_cache_config.kv_cache_groups):
            spec = group.kv_cache_spec
            if isinstance(spec, FullAttentionSpec):
                managers.append(FullAttentionManager(spec, block_pool, i, enable_caching))
            else:
                managers.append(
                    SlidingWindowManager(
                        spec, block_pool, i, enable_caching, max_num_batched_tokens, max_model_len
                    )
                )
        self.single_type_managers: tuple[SingleTypeKVCacheManager, ...] = tuple(managers)
        specs: dict[KVCacheSpec, list[int]] = {}
        for i, group in enumerate(kv_cache_config.kv_cache_groups):
            specs.setdefault(group.kv_cache_spec, []).append(i)
        self.attention_groups = sorted(
            (SpecGroup(spec, ids) for spec, ids in specs.items()),
            key=lambda g: not isinstance(g.spec, FullAttentionSpec),
        )

    # ---- lookup --------------------------------------------------------------------------
    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Per-group hit blocks and the hit length in tokens (see the module docstring)."""
        managers = self.single_type_managers
        hit_blocks: list[list[KVCacheBlock] | None] = [None] * len(managers)
        hit_lengths = [0] * len(managers)
        groups = self.attention_groups
        simple = len(groups) == 2 and isinstance(groups[0].spec, FullAttentionSpec)
        hit_length = max_cache_hit_length
        while True:
            length = hit_length
            for spec, group_ids in groups:
                first = group_ids[0]
                if isinstance(spec, FullAttentionSpec) and hit_blocks[first] is not None:
                    length = min(length, hit_lengths[first])  # downward-closed: trim later
                    continue
                members = [managers[g] for g in group_ids]
                blocks, length = type(members[0]).find_longest_cache_hit(
                    members, block_hashes, length
                )
                for g, row in zip(group_ids, blocks, strict=True):
                    hit_blocks[g] = row
                    hit_lengths[g] = length
            if length >= hit_length:
                break
            hit_length = length
            if simple:
                break
        num_blocks = -(-hit_length // self.block_size)
        for spec, group_ids in groups:
            if isinstance(spec, FullAttentionSpec):
                for g in group_ids:
                    full_row = hit_blocks[g]
                    if full_row is not None:
                        del full_row[num_blocks:]
        return tuple(row if row is not None else [] for row in hit_blocks), hit_length

    # ---- allocation ----------------------------------------------------------------------
    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[list[KVCacheBlock], ...],
        total_computed_tokens: int,
        apply_admission_cap: bool = False,
    ) -> int:
        return sum(
            m.get_num_blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks[i],
                total_computed_tokens,
                apply_admission_cap,
            )
            for i, m in enumerate(self.single_type_managers)
        )

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[list[KVCacheBlock], ...],
        num_local_computed_tokens: int,
    ) -> None:
        """Start a new request's rows with its prefix hit (every group touched before any
        group allocates, so no allocation can evict another group's hit)."""
        for i, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens
            )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens)

    # ---- freeing -------------------------------------------------------------------------
    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> bool:
        """Whether any group freed (and nulled) blocks of the request's rows."""
        freed = [
            m.remove_skipped_blocks(request_id, num_computed_tokens)
            for m in self.single_type_managers
        ]
        return any(freed)

    # ---- views ---------------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's rows, one per group (copies)."""
        return tuple(
            list(m.req_to_block_ids.get(request_id, ())) for m in self.single_type_managers
        )

    def peak_blocks(self, num_tokens: int) -> int:
        """Most blocks one request of `num_tokens` slots holds at once, over all groups."""
        return sum(m.peak_blocks(num_tokens) for m in self.single_type_managers)
