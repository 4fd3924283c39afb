"""Consistency checks of the block pool and the KV cache manager (O(num_blocks); tests and
`KVCacheManager(check_invariants=True)` run them after every mutating call).

Pool:
- the free queue is a well-linked list between its sentinels, with `num_free_blocks` entries;
- a block is in the free queue iff its ref_cnt is 0 (the null block: never, ref_cnt 0);
- ref counts are >= 0; blocks outside the queue have no queue links;
- free + used == usable (used: ref_cnt > 0);
- `num_shared_refs` is the sum of ref_cnt over blocks with ref_cnt >= 2;
- the hash map and the blocks agree: every mapped block holds that hash, every hashed block is
  mapped; nothing is hashed with caching off;
- a hashed block that is not mapped holds a placeholder of deferred hashes (its owner checks).
Manager, in addition:
- each block's ref_cnt equals the number of table entries that hold it, over every KV cache
  group (so once every request is freed, every usable block is free or cached-free);
- the block-id rows mirror the block rows; cached prefixes hold hashes;
- hybrid manager: every group holds a row for the same requests; a block carries the key of
  the group holding it; full-attention rows hold no null block, a window row's nulls (blocks
  freed out of the window) form a prefix.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, cast

from pagesim.errors import InternalError
from pagesim.kvcache.block_pool import BlockPool

if TYPE_CHECKING:
    from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
    from pagesim.kvcache.kv_cache_manager import KVCacheManager
    from pagesim.kvcache.single_type_kv_cache_manager import SingleTypeKVCacheManager


class InvariantViolation(InternalError, AssertionError):
    """The allocator's state is inconsistent (a bug, never bad user input)."""


def require(ok: bool, message: str) -> None:
    """Raise `InvariantViolation(message)` unless `ok`: every allocator's checks use it."""
    if not ok:
        raise InvariantViolation(message)


def check_block_pool(pool: BlockPool) -> None:
    """Raise `InvariantViolation` on the first broken pool invariant."""
    queue = pool.free_block_queue
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    require(
        head.prev_free_block is None and tail.next_free_block is None, "sentinels have outer links"
    )
    in_queue: set[int] = set()
    prev, block = head, head.next_free_block
    while block is not tail:
        if block is None:
            raise InvariantViolation("free queue is cut before its tail sentinel")
        require(
            block.prev_free_block is prev, f"block {block.block_id}: prev link does not point back"
        )
        require(block.block_id not in in_queue, f"block {block.block_id}: in the queue twice")
        require(len(in_queue) <= pool.num_gpu_blocks, "free queue has a cycle")
        in_queue.add(block.block_id)
        prev, block = block, block.next_free_block
    require(tail.prev_free_block is prev, "tail sentinel's prev link is wrong")
    require(
        len(in_queue) == queue.num_free_blocks,
        f"num_free_blocks={queue.num_free_blocks} but the queue holds {len(in_queue)}",
    )
    null = pool.null_block
    require(
        null.is_null
        and null.block_id == 0
        and null.ref_cnt == 0
        and null.block_hash is None
        and 0 not in in_queue,
        "null block misused",
    )
    used = 0
    shared_refs = 0
    for block in pool.blocks:
        require(block.is_null == (block is null), f"block {block.block_id}: wrong is_null")
        require(block.ref_cnt >= 0, f"block {block.block_id}: ref_cnt={block.ref_cnt} < 0")
        if block is null:
            continue
        free = block.block_id in in_queue
        require(
            free == (block.ref_cnt == 0),
            f"block {block.block_id}: ref_cnt={block.ref_cnt}, in free queue={free}",
        )
        if not free:
            used += 1
            if block.ref_cnt > 1:
                shared_refs += block.ref_cnt
            require(
                block.prev_free_block is None and block.next_free_block is None,
                f"block {block.block_id}: used but linked into the queue",
            )
    require(
        queue.num_free_blocks + used == pool.num_usable_blocks,
        f"free {queue.num_free_blocks} + used {used} != usable {pool.num_usable_blocks}",
    )
    require(
        pool.num_shared_refs == shared_refs,
        f"num_shared_refs {pool.num_shared_refs} != {shared_refs} (sum of ref_cnt >= 2)",
    )
    _check_hash_map(pool)


def _check_hash_map(pool: BlockPool) -> None:
    mapped: set[int] = set()
    for block_hash, found in pool.cached_block_hash_to_block.items():
        blocks = found.values() if isinstance(found, dict) else (found,)
        require(len(blocks) > 0, "empty duplicate set in the hash map")
        for block in blocks:
            require(
                block.block_hash == block_hash, f"block {block.block_id}: mapped under another hash"
            )
            require(block.block_id not in mapped, f"block {block.block_id}: mapped twice")
            mapped.add(block.block_id)
    hashed = [b for b in pool.blocks if b.block_hash is not None]
    if not pool.enable_caching:
        require(not hashed, "blocks hashed with caching disabled")
    deferred = [b for b in hashed if b.block_id not in mapped]  # placeholders only
    owner = pool.deferred_hashes
    require(
        owner is not None or not deferred,
        f"hashed blocks {sorted(b.block_id for b in deferred)} not in the map",
    )
    if owner is not None:
        owner.check(deferred)


def check_kv_cache_manager(manager: KVCacheManager | HybridKVCacheManager) -> None:
    """The pool's invariants plus the manager's table bookkeeping, over every KV cache group
    of a hybrid manager (its `single_type_managers`; a `KVCacheManager` is one group)."""
    pool = manager.block_pool
    check_block_pool(pool)
    groups: tuple[SingleTypeKVCacheManager, ...] | None = getattr(
        manager, "single_type_managers", None
    )
    holders: Counter[int] = Counter()
    if groups is None:
        _check_rows(cast("KVCacheManager", manager), holders, None, True)
    else:
        live = groups[0].req_to_blocks.keys()
        for group in groups:
            require(group.req_to_blocks.keys() == live, "KV cache groups disagree on requests")
            _check_rows(group, holders, group.hash_suffix, group.is_full_attention)
    for block in pool.blocks:
        if not block.is_null:
            require(
                block.ref_cnt == holders[block.block_id],
                f"block {block.block_id}: ref_cnt={block.ref_cnt}, held by "
                f"{holders[block.block_id]} table entries",
            )


def _check_rows(
    rows: KVCacheManager | SingleTypeKVCacheManager,
    holders: Counter[int],
    hash_suffix: bytes | None,
    full_attention: bool,
) -> None:
    """One table's rows: maps agree, cached prefixes hold hashes (a group's blocks hold its
    own keys), a full-attention row of a hybrid manager holds no null, a window's nulls
    form a prefix. Counts each row's non-null blocks into `holders`."""
    require(
        rows.req_to_blocks.keys() == rows.req_to_block_ids.keys() == rows.num_cached_block.keys(),
        "request maps disagree on the live requests",
    )
    for rid, row in rows.req_to_blocks.items():
        ids = rows.req_to_block_ids[rid]
        require(ids == [b.block_id for b in row], f"request {rid!r}: id row != block row")
        num_cached = rows.num_cached_block[rid]
        require(num_cached <= len(row), f"request {rid!r}: {num_cached} cached > {len(row)}")
        for block in row[:num_cached]:
            require(
                block.is_null or block.block_hash is not None or not rows.enable_caching,
                f"request {rid!r}: cached block {block.block_id} has no hash",
            )
        if hash_suffix is not None:
            num_null = sum(1 for b in row if b.is_null)
            require(
                not (full_attention and num_null),
                f"request {rid!r}: null block in a full-attention row",
            )
            require(
                all(b.is_null for b in row[:num_null]),
                f"request {rid!r}: null entries of a window row are not a prefix",
            )
            for block in row:
                h = block.block_hash
                require(
                    h is None or (isinstance(h, bytes) and h.endswith(hash_suffix)),
                    f"request {rid!r}: block {block.block_id} cached under another group's key",
                )
        holders.update(b.block_id for b in row if not b.is_null)
