"""The KV cache manager of a model with several KV cache groups (vLLM's `KVCacheManager`
over a `HybridKVCacheCoordinator`): the scheduler-facing calls of `KVCacheManager`, each
spread over the groups' block tables.

    blocks, num_hit_tokens = mgr.get_computed_blocks(req)   # one hit length for all groups
    new = mgr.allocate_slots(req, num_new_tokens, num_hit_tokens, blocks)
    mgr.get_block_ids(req.request_id)                       # one row per group
    mgr.free(req)

A models of one attention kind is one group and uses `KVCacheManager`, whose single-table path
this leaves untouched. Not here (vLLM has neither for hybrid models in this form): deferred
hashes, copy-on-write forks, swap preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagesim.kvcache.alloc_checks import check_allocation_arguments, check_ever_fits
from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.hashing import BlockHasher
from pagesim.kvcache.invariants import check_kv_cache_manager
from pagesim.kvcache.kv_cache_coordinator import HybridKVCacheCoordinator
from pagesim.kvcache.kv_cache_spec import KVCacheConfig
from pagesim.kvcache.pool_views import BlockPoolViews
from pagesim.kvcache.slot_allocator import SlotAllocator, SlotExtras
from pagesim.request import Request


@dataclass(slots=True)
class HybridKVCacheBlocks:
    """An allocation or hit result: one block list per KV cache group, in table order."""

    blocks: tuple[Sequence[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)

    def __len__(self) -> int:
        """Blocks in the first group (every group's hit has the same length)."""
        return len(self.blocks[0])


class HybridKVCacheManager(SlotAllocator[HybridKVCacheBlocks], BlockPoolViews):
    """Block tables of all live requests, one row per KV cache group, over one `BlockPool`
    of `kv_cache_config.num_blocks` blocks. Arguments as `KVCacheManager`'s."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        enable_caching: bool = True,
        vllm_compat: str = "0.33",
        check_invariants: bool = False,
        *,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_kv_cache_events: bool = False,
    ) -> None:
        self._init_block_pool(
            kv_cache_config.num_blocks,
            enable_caching,
            vllm_compat,
            max_model_len,
            enable_kv_cache_events,
        )
        self.kv_cache_config = kv_cache_config
        self.block_size = kv_cache_config.block_size
        self.coordinator = HybridKVCacheCoordinator(
            kv_cache_config, self.block_pool, enable_caching, max_num_batched_tokens, max_model_len
        )
        self.single_type_managers = self.coordinator.single_type_managers
        self.hasher = BlockHasher(self.block_size)
        self.check_invariants = check_invariants
        self.empty_kv_cache_blocks = HybridKVCacheBlocks(
            tuple(() for _ in kv_cache_config.kv_cache_groups)
        )
        # As `KVCacheManager.rewritten_req_ids`: rows a sliding window nulled entries of.
        self.rewritten_req_ids: set[str] = set()

    # ---- read-only views -------------------------------------------------------------------
    @property
    def num_blocks_to_copy(self) -> int:
        return 0

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        return []

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block-table rows, one per group (copies; 0 for null entries)."""
        return self.coordinator.get_block_ids(request_id)

    def decode_row_blocks(self, request_id: str) -> int | None:
        """Never a plain decode row: windows free blocks on the way (no bulk decodes)."""
        return None

    def can_fit(self, num_tokens: int) -> bool:
        """Whether one request of `num_tokens` tokens could ever hold its blocks in all groups
        at once, the pool being otherwise empty (sliding groups at their peak)."""
        return self.coordinator.peak_blocks(num_tokens) <= self.num_usable_blocks

    # ---- prefix lookup ---------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[HybridKVCacheBlocks, int]:
        """The longest prefix every group can serve from the cache (at most
        `num_tokens - 1` tokens, whole blocks), and its length. Touches nothing."""
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0
        if len(request.block_hashes) < request.num_tokens // self.block_size:
            self.hasher.extend(request)
        blocks, num_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        if not num_tokens:
            return self.empty_kv_cache_blocks, 0
        return HybridKVCacheBlocks(blocks), num_tokens

    # ---- allocation ------------------------------------------------------------------------
    def _allocate_slots(
        self, request: Request, num_new_tokens: int, extras: SlotExtras[HybridKVCacheBlocks]
    ) -> HybridKVCacheBlocks | None:
        """`KVCacheManager`'s allocation over every group: None when the free blocks do not
        suffice for all groups together (then nothing changed, except that blocks already out
        of a window were released first, as in vLLM)."""
        rid = request.request_id
        num_new_computed_tokens = extras.num_new_computed_tokens
        new_computed_blocks = extras.new_computed_blocks
        num_lookahead_tokens = extras.num_lookahead_tokens
        coordinator = self.coordinator
        running = rid in self.single_type_managers[0].req_to_blocks
        hit = (
            new_computed_blocks.blocks
            if new_computed_blocks is not None
            else self.empty_kv_cache_blocks.blocks
        )
        check_allocation_arguments(
            rid,
            running,
            num_new_tokens,
            num_new_computed_tokens,
            hit[0],
            num_lookahead_tokens,
            self.block_size,
        )
        hit_lists = tuple(list(g) for g in hit)
        cap = self.max_model_len
        local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = local_computed if cap is None else min(local_computed, cap)
        free_blocks = self.block_pool.free_block_queue
        if extras.full_sequence_must_fit:
            full_tokens = request.num_tokens if cap is None else min(request.num_tokens, cap)
            needed = coordinator.get_num_blocks_to_allocate(
                rid, full_tokens, hit_lists, total_computed, apply_admission_cap=True
            )
            if needed > free_blocks.num_free_blocks:
                return None
        need_slots = total_computed + num_new_tokens + num_lookahead_tokens
        if cap is not None and need_slots > cap:
            need_slots = cap
        check_ever_fits(
            rid, num_new_tokens, coordinator.peak_blocks(need_slots), self.num_usable_blocks
        )
        if coordinator.remove_skipped_blocks(rid, total_computed):
            self.rewritten_req_ids.add(rid)
        needed = coordinator.get_num_blocks_to_allocate(rid, need_slots, hit_lists, local_computed)
        if needed > free_blocks.num_free_blocks:
            return None
        # ---- commit: from here on the allocation cannot fail ----
        if not running:
            coordinator.allocate_new_computed_blocks(rid, hit_lists, local_computed)
        new_blocks = coordinator.allocate_new_blocks(rid, need_slots)
        if self.enable_caching:
            num_full = min(total_computed + num_new_tokens, request.num_tokens)
            if len(request.block_hashes) < num_full // self.block_size:
                self.hasher.extend(request)
            coordinator.cache_blocks(request, num_full)
            if not running:
                self._record_admission(request, num_new_computed_tokens)
        if self.check_invariants:
            check_kv_cache_manager(self)
        return HybridKVCacheBlocks(new_blocks)

    # ---- freeing ---------------------------------------------------------------------------
    def free(self, request: Request) -> None:
        """Release the request's rows, group by group, each tail first."""
        self.coordinator.free(request.request_id)
        self.rewritten_req_ids.discard(request.request_id)
        if self.check_invariants:
            check_kv_cache_manager(self)
