"""Helpers for the KV cache manager tests: requests, admission, decode, state snapshots."""

from __future__ import annotations

from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.request import Request


def make_manager(num_gpu_blocks: int, block_size: int = 16, **kw) -> KVCacheManager:
    kw.setdefault("check_invariants", True)
    return KVCacheManager(num_gpu_blocks=num_gpu_blocks, block_size=block_size, **kw)


def make_request(rid: str, tokens: list[int], max_tokens: int = 16, **kw) -> Request:
    return Request(request_id=rid, prompt_token_ids=tokens, max_tokens=max_tokens, **kw)


def admit(
    mgr: KVCacheManager, req: Request, num_new_tokens: int | None = None, **kw
) -> tuple[list[int], list[int] | None, int]:
    """Prefix lookup + allocation as the scheduler does it.

    Returns (hit block ids, new block ids or None on failure, hit tokens); on success the
    request's computed tokens advance as if the step ran.
    """
    hit, num_hit = mgr.get_computed_blocks(req)
    n = req.num_tokens - num_hit if num_new_tokens is None else num_new_tokens
    new = mgr.allocate_slots(req, n, num_new_computed_tokens=num_hit, new_computed_blocks=hit, **kw)
    if new is None:
        return hit.get_block_ids(), None, num_hit
    req.num_computed_tokens = num_hit + n
    return hit.get_block_ids(), new.get_block_ids(), num_hit


def decode(mgr: KVCacheManager, req: Request, token: int = 7) -> list[int] | None:
    """Append one generated token and give it a slot; the new block ids, None on failure."""
    req.output_token_ids.append(token)
    new = mgr.allocate_slots(req, req.num_tokens - req.num_computed_tokens)
    if new is None:
        req.output_token_ids.pop()
        return None
    req.num_computed_tokens = req.num_tokens
    return new.get_block_ids()


def free_queue(mgr: KVCacheManager | HybridKVCacheManager) -> list[int]:
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


def snapshot(mgr: KVCacheManager | HybridKVCacheManager) -> tuple:
    """Everything a failed allocation must leave untouched."""
    pool = mgr.block_pool
    return (
        free_queue(mgr),
        [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        {
            k: (v if isinstance(v, dict) else v.block_id)
            for k, v in pool.cached_block_hash_to_block.items()
        },
        [
            (
                {rid: list(ids) for rid, ids in rows.req_to_block_ids.items()},
                dict(rows.num_cached_block),
            )
            for rows in getattr(mgr, "single_type_managers", (mgr,))
        ],
        repr(mgr.prefix_cache_stats),
        mgr.take_blocks_to_copy(),
    )
