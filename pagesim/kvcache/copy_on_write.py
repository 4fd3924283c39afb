"""Copy-on-write of shared blocks, for forked requests (parallel sampling, beam search).

After `fork`, parent and child hold the same blocks. Blocks before the one the next token is
written to are full and never written again: they stay shared. The block that receives the next
token, and any preallocated block after it, must become private to the writer first:

    parent row [b1, b2]   b2 holds tokens 4, 5 of block_size 4; next write at position 6
    child  row [b1, b2]
    parent writes  ->  parent row [b1, b9], copy (b2 -> b9) recorded; child keeps b2 alone
"""

from __future__ import annotations

from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.block_pool import BlockPool


def shared_write_indices(
    row: list[KVCacheBlock], num_computed_tokens: int, block_size: int
) -> list[int]:
    """Table indices, from the block the next token goes to, whose blocks another request
    also holds."""
    return [j for j in range(num_computed_tokens // block_size, len(row)) if row[j].ref_cnt > 1]


def replace_shared_blocks(
    pool: BlockPool,
    row: list[KVCacheBlock],
    row_ids: list[int],
    indices: list[int],
    num_computed_tokens: int,
    block_size: int,
) -> list[tuple[int, int]]:
    """Give the writer fresh blocks at `indices`; returns the (src, dst) block copies the GPU
    must make (only the block that already holds written tokens needs one). The caller has
    checked that `len(indices)` blocks are free."""
    fresh = pool.get_new_blocks(len(indices))
    written_block, offset = divmod(num_computed_tokens, block_size)
    copies: list[tuple[int, int]] = []
    released: list[KVCacheBlock] = []
    for j, block in zip(indices, fresh, strict=True):
        released.append(row[j])
        if j == written_block and offset:
            copies.append((row[j].block_id, block.block_id))
        row[j] = block
        row_ids[j] = block.block_id
    pool.free_blocks(released)  # still held by the other sharer(s): only the counts drop
    return copies
