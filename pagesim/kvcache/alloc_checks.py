"""Checks of `KVCacheManager.allocate_slots`, raised before anything changes: its contract
with the scheduler (an `InternalError`, a bug) and whether a request can ever fit (an
`AllocationError`). Each names the field and value in one line."""

from __future__ import annotations

from collections.abc import Sequence

from pagesim.errors import AllocationError, InternalError
from pagesim.kvcache.block import KVCacheBlock


def check_allocation_arguments(
    request_id: str,
    is_running: bool,
    num_new_tokens: int,
    num_new_computed_tokens: int,
    hit: Sequence[KVCacheBlock],
    num_lookahead_tokens: int,
    block_size: int,
) -> None:
    if num_new_tokens < 1:
        raise InternalError(
            f"num_new_tokens={num_new_tokens}: must be >= 1 (request {request_id!r})"
        )
    if num_lookahead_tokens < 0:
        raise InternalError(f"num_lookahead_tokens={num_lookahead_tokens}: must be >= 0")
    if num_new_computed_tokens != len(hit) * block_size:
        raise InternalError(
            f"num_new_computed_tokens={num_new_computed_tokens}: the hit holds {len(hit)} "
            f"blocks of {block_size} tokens (request {request_id!r})"
        )
    if hit and is_running:
        raise InternalError(
            f"new_computed_blocks: request {request_id!r} is running; only a "
            "new request takes a prefix hit"
        )


def check_ever_fits(
    request_id: str, num_new_tokens: int, num_live_blocks: int, num_usable_blocks: int
) -> None:
    """A request that would hold more blocks than the whole cache can never be served."""
    if num_live_blocks > num_usable_blocks:
        raise AllocationError(
            f"num_new_tokens={num_new_tokens}: request {request_id!r} would hold "
            f"{num_live_blocks} blocks, the cache has {num_usable_blocks} usable blocks"
        )
