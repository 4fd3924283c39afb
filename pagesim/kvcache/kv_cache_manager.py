"""Per-request KV block allocation with prefix caching (vLLM v1's `KVCacheManager`, one
attention group: full attention, or sliding window as vLLM's `SlidingWindowManager`).

The scheduler's view of a request's KV cache:

    | <- computed (in cache) -> | <- new_comp: prefix hit -> | <- new -> | <- lookahead -> |
                                                              |   to be computed this step  |
                                |        allocated by this allocate_slots call            |

    blocks, num_hit_tokens = mgr.get_computed_blocks(req)          # touches nothing
    new = mgr.allocate_slots(req, num_new_tokens, num_hit_tokens, blocks)
    # None: not enough free blocks; nothing changed. Otherwise the scheduler advances
    # req.num_computed_tokens by num_hit_tokens + num_new_tokens once the step is run.
    mgr.free(req)

Caching happens at allocation, as in vLLM: every block that the computed + new tokens fill is
hashed and registered before the step runs, so a request admitted later in the same step can
already hit it. The manager extends `Request.block_hashes` (with caching on) as the request's
blocks fill, prompt and generated tokens alike, hashing each block once. With an owner of
deferred hashes (the simulator's setting, `pagesim.kvcache.deferred_hashes`) blocks after a
request's first are hashed only when a lookup could see them: the same decisions.

Bulk decodes (the simulator's `pagesim.sim.bulk.decodes`) leave a decoding request's counters
behind and make only the calls that change something: `append_decode_blocks` when contexts
fill their rows, `cache_decode_block` / `cache_decode_blocks` for the blocks they fill, each
what `allocate_slots(request, 1)` does then (`tests/kvcache/test_decode_events.py` holds them to
it).

Copy-on-write (n > 1 sampling, beam search): `fork(parent, child)` shares the parent's blocks.
A request about to write into a shared block gets a private copy first; `take_blocks_to_copy()`
hands the (src, dst) pairs to the runner. Full blocks are never written again and stay shared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from pagesim.errors import ConfigError, InternalError
from pagesim.kvcache.alloc_checks import check_allocation_arguments, check_ever_fits
from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.copy_on_write import replace_shared_blocks, shared_write_indices
from pagesim.kvcache.deferred_hashes import DeferredHashesFactory
from pagesim.kvcache.hashing import BlockHasher
from pagesim.kvcache.invariants import check_kv_cache_manager
from pagesim.kvcache.pool_views import BlockPoolViews
from pagesim.kvcache.sliding_window import SlidingWindow
from pagesim.kvcache.slot_allocator import NO_EXTRAS, SlotAllocator, SlotExtras
from pagesim.request import Request

_block_id = attrgetter("block_id")


@dataclass(slots=True)
class KVCacheBlocks:
    """An allocation result: blocks in table order. Hides the pool's internals from the
    scheduler, which only reads block ids (vLLM's `KVCacheBlocks`, one group)."""

    blocks: Sequence[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [block.block_id for block in self.blocks]

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.blocks) + list(other.blocks))

    def __len__(self) -> int:
        return len(self.blocks)


class KVCacheManager(SlotAllocator[KVCacheBlocks], BlockPoolViews):
    """Block tables of all live requests over one `BlockPool`.

    `vllm_compat` picks the free order ("0.33": unhashed freed blocks reused first; "0.23":
    plain LRU). `sliding_window` (tokens) frees blocks that no future query can see, replacing
    them by the null block in the table. `max_model_len` caps slots as vLLM does;
    `max_num_batched_tokens` enables vLLM's recycling-aware admission cap for sliding windows.
    With `check_invariants`, every mutating call ends with a full consistency check (slow).
    `deferred_hashes` builds the owner of deferred hashes from the pool and the hasher (see the
    module docstring; not used with a sliding window, whose lookups read the whole map, or KV
    events).
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        sliding_window: int | None = None,
        vllm_compat: str = "0.33",
        check_invariants: bool = False,
        *,
        max_model_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        enable_kv_cache_events: bool = False,
        deferred_hashes: DeferredHashesFactory | None = None,
    ) -> None:
        if not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size={block_size!r}: must be an int >= 1")
        self._init_block_pool(
            num_gpu_blocks, enable_caching, vllm_compat, max_model_len, enable_kv_cache_events
        )
        self.block_size = block_size
        self.sliding_window = sliding_window
        self._window = (
            None
            if sliding_window is None
            else SlidingWindow(sliding_window, block_size, max_num_batched_tokens, max_model_len)
        )
        self.hasher = BlockHasher(block_size)
        self.deferred_hashes = (
            deferred_hashes(self.block_pool, self.hasher)
            if deferred_hashes is not None
            and enable_caching
            and sliding_window is None
            and not enable_kv_cache_events
            else None
        )
        self.block_pool.deferred_hashes = self.deferred_hashes
        self.check_invariants = check_invariants
        # request id -> blocks / block ids in table order (the same row, kept in step).
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}
        # request id -> leading blocks already registered in the prefix cache (or null).
        self.num_cached_block: dict[str, int] = {}
        # Requests that may share a block they will write (forked); membership only.
        self._cow_req_ids: set[str] = set()
        self._blocks_to_copy: list[tuple[int, int]] = []
        # Requests whose row had entries replaced in place (copy-on-write, sliding window)
        # since the scheduler last sent them whole; membership only, the scheduler clears it.
        self.rewritten_req_ids: set[str] = set()
        self.empty_kv_cache_blocks = KVCacheBlocks(())

    # ---- read-only views -------------------------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block-table row (block ids, 0 for null entries).

        Returns the manager's live list, not a copy (hot path): callers must not mutate it,
        and must copy it if they keep it across allocate_slots/free calls.
        """
        return self.req_to_block_ids.get(request_id, [])

    def decode_row_blocks(self, request_id: str) -> int | None:
        """Blocks of the request's block-table row while its next tokens can be counted as
        plain decodes, writing only blocks of its own (no copy-on-write pending); None when it
        holds no row or shares a block it would write."""
        row = self.req_to_block_ids.get(request_id)
        if row is None or request_id in self._cow_req_ids:
            return None
        return len(row)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(list(self.req_to_blocks.get(request_id, ())))

    def can_fit(self, num_tokens: int) -> bool:
        """Whether one request of `num_tokens` tokens could ever hold its blocks, the pool
        being otherwise empty. Sliding window: its peak while decoding, or while prefilling in
        chunks of `max_num_batched_tokens` when that is given. Schedulers reject requests for
        which this is False; allocate_slots raises AllocationError for them."""
        blocks = -(-num_tokens // self.block_size)
        if self._window is not None:
            blocks = min(blocks, self._window.peak_blocks)
        return blocks <= self.num_usable_blocks

    # ---- prefix lookup ---------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Longest prefix of the request's full blocks found in the cache, and its length in
        tokens. At most `num_tokens - 1` tokens hit, floored to whole blocks: the last token is
        always recomputed for its logits, so a prompt of exactly k cached blocks hits k - 1.
        Touches nothing: the hit takes effect in `allocate_slots`."""
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0
        if self.deferred_hashes is not None:
            hit = self.deferred_hashes.lookup(request)
            if not hit:
                return self.empty_kv_cache_blocks, 0
            return KVCacheBlocks(hit), len(hit) * self.block_size
        hashes = request.block_hashes
        if (
            len(hashes)
            < (len(request.prompt_token_ids) + len(request.output_token_ids)) // self.block_size
        ):
            self.hasher.extend(request)
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        if self._window is not None:
            pool = self.block_pool
            hit = self._window.find_longest_cache_hit(
                pool.get_cached_block, pool.null_block, hashes, max_num_blocks
            )
        else:
            hit = []
            cache = self.block_pool.cached_block_hash_to_block
            for i in range(max_num_blocks):
                found = cache.get(hashes[i])
                if found is None:
                    break
                hit.append(next(iter(found.values())) if isinstance(found, dict) else found)
        if not hit:
            return self.empty_kv_cache_blocks, 0
        return KVCacheBlocks(hit), len(hit) * self.block_size

    # ---- allocation ------------------------------------------------------------------------
    def _allocate_slots(
        self, request: Request, num_new_tokens: int, extras: SlotExtras[KVCacheBlocks]
    ) -> KVCacheBlocks | None:
        """With a sliding window, blocks already out of the window are released first even
        when the call then returns None (as in vLLM)."""
        rid = request.request_id
        row = self.req_to_blocks.get(rid)
        if (
            row is None
            or extras is not NO_EXTRAS
            or self._window is not None
            or rid in self._cow_req_ids
            or num_new_tokens < 1
            or (
                self.max_model_len is not None
                and request.num_computed_tokens + num_new_tokens > self.max_model_len
            )
        ):
            return self._allocate_slots_general(request, row, num_new_tokens, extras)
        # The common case: a running full-attention request growing by num_new_tokens (decode).
        bs = self.block_size
        main = request.num_computed_tokens + num_new_tokens
        num_new_blocks = -(-main // bs) - len(row)
        result = self.empty_kv_cache_blocks
        if num_new_blocks > 0:
            pool = self.block_pool
            if num_new_blocks > pool.free_block_queue.num_free_blocks:
                check_ever_fits(rid, num_new_tokens, -(-main // bs), pool.num_usable_blocks)
                return None
            new_blocks = pool.get_new_blocks(num_new_blocks)
            row.extend(new_blocks)
            if num_new_blocks == 1:  # a decode crossing into a new block
                self.req_to_block_ids[rid].append(new_blocks[0].block_id)
            else:
                self.req_to_block_ids[rid].extend(map(_block_id, new_blocks))
            result = KVCacheBlocks(new_blocks)
        if self.enable_caching:
            num_tokens = len(request.prompt_token_ids) + len(request.output_token_ids)
            num_full = (main if main < num_tokens else num_tokens) // bs
            if num_full > self.num_cached_block[rid]:
                self._cache_blocks(request, row, num_full)
        if self.check_invariants:
            check_kv_cache_manager(self)
        return result

    def _allocate_slots_general(
        self,
        request: Request,
        row: list[KVCacheBlock] | None,
        num_new_tokens: int,
        extras: SlotExtras[KVCacheBlocks],
    ) -> KVCacheBlocks | None:
        rid = request.request_id
        num_new_computed_tokens = extras.num_new_computed_tokens
        new_computed_blocks = extras.new_computed_blocks
        num_lookahead_tokens = extras.num_lookahead_tokens
        hit = new_computed_blocks.blocks if new_computed_blocks is not None else ()
        bs, pool, window, cap = self.block_size, self.block_pool, self._window, self.max_model_len
        check_allocation_arguments(
            rid,
            row is not None,
            num_new_tokens,
            num_new_computed_tokens,
            hit,
            num_lookahead_tokens,
            bs,
        )
        local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = local_computed if cap is None else min(local_computed, cap)
        if extras.full_sequence_must_fit:
            full_tokens = request.num_tokens if cap is None else min(request.num_tokens, cap)
            check_ever_fits(
                rid,
                num_new_tokens,
                self._num_live_blocks(full_tokens, 0, True),
                pool.num_usable_blocks,
            )
            needed = self.get_num_blocks_to_allocate(
                request, full_tokens, new_computed_blocks, num_new_computed_tokens, admission=True
            )
            if needed > pool.free_block_queue.num_free_blocks:
                return None
        main = total_computed + num_new_tokens
        need_slots = main + num_lookahead_tokens
        if cap is not None and need_slots > cap:
            need_slots = cap
        check_ever_fits(
            rid,
            num_new_tokens,
            self._num_live_blocks(need_slots, total_computed),
            pool.num_usable_blocks,
        )
        if window is not None and row is not None:
            self.remove_skipped_blocks(rid, total_computed)
        needed = self.get_num_blocks_to_allocate(
            request, need_slots, new_computed_blocks, num_new_computed_tokens
        )
        cow: list[int] = []
        if row is not None and rid in self._cow_req_ids:
            cow = shared_write_indices(row, request.num_computed_tokens, bs)
            if not cow:  # nothing it writes is shared any more
                self._cow_req_ids.discard(rid)
        if needed + len(cow) > pool.free_block_queue.num_free_blocks:
            return None
        # ---- commit: from here on the allocation cannot fail ----
        is_new = row is None
        if row is None:
            row = self.req_to_blocks[rid] = []
            self.req_to_block_ids[rid] = []
            self.num_cached_block[rid] = 0
            if hit:
                self._add_computed_blocks(rid, row, hit, local_computed)
        if cow:
            self.rewritten_req_ids.add(rid)
            self._blocks_to_copy += replace_shared_blocks(
                pool, row, self.req_to_block_ids[rid], cow, request.num_computed_tokens, bs
            )
        num_new_blocks = -(-need_slots // bs) - len(row)
        new_blocks = pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        if new_blocks:
            row.extend(new_blocks)
            self.req_to_block_ids[rid].extend(map(_block_id, new_blocks))
        if self.enable_caching:
            num_full = min(total_computed + num_new_tokens, request.num_tokens) // bs
            if num_full > self.num_cached_block[rid]:
                self._cache_blocks(request, row, num_full)
            if is_new:
                self._record_admission(request, num_new_computed_tokens)
        if self.check_invariants:
            check_kv_cache_manager(self)
        return KVCacheBlocks(new_blocks) if new_blocks else self.empty_kv_cache_blocks

    def get_num_blocks_to_allocate(
        self,
        request: Request,
        num_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_new_computed_tokens: int = 0,
        admission: bool = False,
    ) -> int:
        """Free blocks that giving the request `num_tokens` slots would consume now: new blocks
        plus prefix-hit blocks that are eviction candidates (they leave the free queue).
        `admission` applies the sliding-window admission cap. Changes nothing."""
        rid = request.request_id
        num_required = -(-num_tokens // self.block_size)
        if admission and self._window is not None:
            num_required = self._window.cap_admission_blocks(num_required)
        row = self.req_to_blocks.get(rid)
        if row is not None:  # running: no new prefix hits
            return max(num_required - len(row), 0)
        hit = new_computed_blocks.blocks if new_computed_blocks is not None else ()
        computed = request.num_computed_tokens + num_new_computed_tokens
        num_skipped = 0 if self._window is None else self._window.num_skipped_blocks(computed)
        num_new = max(num_required - max(num_skipped, len(hit)), 0)
        num_evictable = sum(1 for b in hit[num_skipped:] if b.ref_cnt == 0 and not b.is_null)
        return num_new + num_evictable

    # ---- freeing and sliding window --------------------------------------------------------
    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first (its last blocks are evicted first)."""
        rid = request.request_id
        row = self.req_to_blocks.pop(rid, None)
        self.req_to_block_ids.pop(rid, None)
        self.num_cached_block.pop(rid, None)
        self._cow_req_ids.discard(rid)
        self.rewritten_req_ids.discard(rid)
        if self.deferred_hashes is not None:
            self.deferred_hashes.forget_request(rid)
        if row:
            self.block_pool.free_blocks(reversed(row))
        if self.check_invariants:
            check_kv_cache_manager(self)

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Sliding window: free the blocks no future query can see (every token before
        `num_computed_tokens - sliding_window + 1`), putting the null block in their place."""
        row = self.req_to_blocks.get(request_id)
        if self._window is None or not row:
            return
        freed = self._window.remove_skipped_blocks(
            self.block_pool, row, self.req_to_block_ids[request_id], num_computed_tokens
        )
        if freed:
            self.rewritten_req_ids.add(request_id)
            if self.check_invariants:
                check_kv_cache_manager(self)

    # ---- copy-on-write ---------------------------------------------------------------------
    def fork(self, parent: Request, child: Request) -> None:
        """Give `child` the parent's blocks, shared (ref counts up, nothing copied yet).

        The child's tokens must equal the parent's up to `parent.num_computed_tokens`, and the
        caller sets `child.num_computed_tokens` to that. Whichever of the two next writes into a
        shared, not yet full block gets a private copy (see `take_blocks_to_copy`).
        """
        prow = self.req_to_blocks.get(parent.request_id)
        if prow is None:
            raise InternalError(f"parent={parent.request_id!r}: has no blocks to fork")
        if child.request_id in self.req_to_blocks:
            raise InternalError(f"child={child.request_id!r}: already holds blocks")
        self.block_pool.touch(prow)
        if not child.block_hashes:  # equal tokens: reuse the parent's hashes, never rehash
            child.block_hashes.extend(
                parent.block_hashes[: parent.num_computed_tokens // self.block_size]
            )
        self.req_to_blocks[child.request_id] = list(prow)
        self.req_to_block_ids[child.request_id] = list(self.req_to_block_ids[parent.request_id])
        self.num_cached_block[child.request_id] = self.num_cached_block[parent.request_id]
        self._cow_req_ids.add(parent.request_id)
        self._cow_req_ids.add(child.request_id)
        if self.check_invariants:
            check_kv_cache_manager(self)

    @property
    def num_blocks_to_copy(self) -> int:
        """Copies waiting for `take_blocks_to_copy` (0 unless forked requests wrote)."""
        return len(self._blocks_to_copy)

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        """(src_block_id, dst_block_id) copies made since the last call, in order."""
        out, self._blocks_to_copy = self._blocks_to_copy, []
        return out

    # ---- bulk decodes (see the module docstring) ----------------------------------------------
    def append_decode_blocks(self, request_ids: Sequence[str]) -> bool:
        """One more block at the end of each request's row, in order: what `allocate_slots(
        request, 1)` does for a full-attention decode whose context fills its row exactly, for
        consecutive such calls. False: fewer free blocks than requests; nothing changed. The
        caller guarantees `allocate_slots`' common-case conditions (no sliding window, no
        copy-on-write, the max_model_len cap not reached); full blocks of the rows may still
        wait to be cached (`cache_decode_blocks`)."""
        pool = self.block_pool
        if len(request_ids) > pool.free_block_queue.num_free_blocks:
            return False
        req_to_blocks, req_to_block_ids = self.req_to_blocks, self.req_to_block_ids
        for request_id, block in zip(
            request_ids, pool.get_new_blocks(len(request_ids)), strict=True
        ):
            req_to_blocks[request_id].append(block)
            req_to_block_ids[request_id].append(block.block_id)
        if self.check_invariants:
            check_kv_cache_manager(self)
        return True

    def cache_decode_block(self, request: Request, packed_tokens: bytes) -> None:
        """Cache the request's next full block (row index `num_cached_block`, not the first),
        its tokens given packed as little-endian int32 because they may not be in the request
        yet: what `allocate_slots(request, 1)` does when a decode fills a block."""
        rid = request.request_id
        index = self.num_cached_block[rid]
        row = self.req_to_blocks[rid]
        if not 0 < index < len(row):
            raise InternalError(
                f"request_id={rid!r}: block {index} of a row of {len(row)} "
                "is not a decode block to cache"
            )
        if self.deferred_hashes is not None:
            self.deferred_hashes.defer(request, row, index, index + 1, packed_tokens)
        else:
            hashes = request.block_hashes
            if len(hashes) == index:
                hashes.append(self.hasher.next_hash(hashes[-1], packed_tokens, request.lora_name))
            self.block_pool.cache_block(row[index], hashes[index])
        self.num_cached_block[rid] = index + 1
        if self.check_invariants:
            check_kv_cache_manager(self)

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
                f"of {len(row)} ({request.num_tokens} tokens) are not decode blocks to cache"
            )
        self._cache_blocks(request, row, num_full)
        if self.check_invariants:
            check_kv_cache_manager(self)

    # ---- helpers ---------------------------------------------------------------------------
    def _add_computed_blocks(
        self,
        rid: str,
        row: list[KVCacheBlock],
        hit: Sequence[KVCacheBlock],
        num_computed_tokens: int,
    ) -> None:
        """Append a new request's prefix hit: touch it, null-pad what a window skips."""
        num_skipped = (
            0 if self._window is None else self._window.num_skipped_blocks(num_computed_tokens)
        )
        if num_skipped:
            hit = hit[num_skipped:]
        self.block_pool.touch(hit)
        null = self.block_pool.null_block
        row.extend([null] * num_skipped)
        row.extend(hit)
        self.req_to_block_ids[rid].extend(map(_block_id, row))
        self.num_cached_block[rid] = len(row)

    def _cache_blocks(self, request: Request, row: list[KVCacheBlock], num_full: int) -> None:
        rid = request.request_id
        deferred = self.deferred_hashes
        if deferred is not None:  # the first block now, the others deferred
            start = self.num_cached_block[rid]
            hashes = request.block_hashes
            if not hashes:
                self.hasher.extend(request, 1)
            if start == 0:
                self.block_pool.cache_full_blocks(row, hashes, 0, 1)
                start = 1
            if num_full > start:
                deferred.defer(request, row, start, num_full, None)
            self.num_cached_block[rid] = num_full
            return
        if len(request.block_hashes) < num_full:
            self.hasher.extend(request)
        self.block_pool.cache_full_blocks(
            row, request.block_hashes, self.num_cached_block[rid], num_full
        )
        self.num_cached_block[rid] = num_full

    def _num_live_blocks(
        self, num_tokens: int, num_computed_tokens: int, admission: bool = False
    ) -> int:
        """Non-null blocks a request with `num_tokens` slots holds right after allocation."""
        blocks = -(-num_tokens // self.block_size)
        if self._window is None:
            return blocks
        return self._window.live_blocks(blocks, num_computed_tokens, admission)
