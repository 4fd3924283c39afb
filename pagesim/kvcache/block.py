"""KV-cache block metadata and the free-block queue (vLLM v1's `KVCacheBlock`,
`FreeKVCacheBlockQueue`).

A block is one page of `block_size` token slots in the GPU KV cache. Its metadata lives in one
`KVCacheBlock` per physical block, created once by the pool and never re-created: the free queue
threads its links through these same objects, so allocating and freeing create no Python objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from pagesim.errors import InternalError


class KVCacheBlock:
    """Metadata of one physical KV block. Equality is identity: one object per block id.

    `block_hash` is set while the block is *cached* (full and registered in the pool's hash map);
    it stays set while the block sits in the free queue (an eviction candidate) and is cleared
    only when the pool hands the block out again (lazy eviction). With deferred hashes
    (`pagesim.kvcache.deferred_hashes`) a cached block may hold a placeholder, bytes that are
    no key of the hash map, until its hash is computed.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "prev_free_block",
        "next_free_block",
        "is_null",
    )

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        block_hash: bytes | None = None,
        prev_free_block: KVCacheBlock | None = None,
        next_free_block: KVCacheBlock | None = None,
        is_null: bool = False,
    ) -> None:
        self.block_id = block_id  # index into the KV cache: slots block_id * block_size ...
        self.ref_cnt = ref_cnt  # requests whose block table holds this block (0: free queue)
        self.block_hash = block_hash  # chained hash of its tokens once cached; None: not cached
        # Free-queue links; None while the block is used. Inside the queue they are never None
        # (the sentinels bound it), which the hot loops below rely on without checking.
        self.prev_free_block = prev_free_block
        self.next_free_block = next_free_block
        self.is_null = is_null  # the placeholder block 0: never allocated, never freed

    def __repr__(self) -> str:  # links would recurse through the whole queue
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"hashed={self.block_hash is not None}, is_null={self.is_null})"
        )


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, in eviction order.

    Not a `collections.deque` because a prefix-cache hit must take a free cached block out of
    the *middle* of the queue in O(1) (`remove`), and because threading the links through the
    blocks themselves allocates nothing per operation.

    Order: the head is the least recently used block and is handed out (and its cached hash
    evicted) first. The pool appends freed blocks at the tail (a request's blocks in reverse, so
    that its last, least shareable blocks are evicted first); from vLLM 0.24 on, freed blocks
    that hold no hash are put at the head instead (`prepend_n`), to be reused first.

        fake_head <-> b_lru <-> ... <-> b_mru <-> fake_tail

    Two sentinels make every insert and remove branch-free. All operations are O(1) per block.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self.fake_free_list_head = KVCacheBlock(block_id=-1)
        self.fake_free_list_tail = KVCacheBlock(block_id=-1)
        prev = self.fake_free_list_head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Take the head (least recently used) block out of the queue."""
        block = self.fake_free_list_head.next_free_block
        if block is self.fake_free_list_tail or block is None:
            raise InternalError("free block queue is empty: no block to pop")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the `n` head blocks out of the queue, in order; the caller checks that `n`
        are free (`num_free_blocks`)."""
        head = self.fake_free_list_head
        # Inside the queue the links are never None (the sentinels bound it).
        block: KVCacheBlock = head.next_free_block  # type: ignore[assignment]
        out: list[KVCacheBlock] = []
        append = out.append
        for _ in range(n):
            append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt  # type: ignore[assignment]
        head.next_free_block = block
        block.prev_free_block = head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from anywhere in the queue in O(1)."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise InternalError(f"block_id={block.block_id}: not in the free block queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail: it becomes the last to be evicted."""
        tail = self.fake_free_list_tail
        last: KVCacheBlock = tail.prev_free_block  # type: ignore[assignment]
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = tail
        tail.prev_free_block = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put `blocks` at the tail, in order (`blocks[-1]` ends up last)."""
        if blocks:
            tail = self.fake_free_list_tail
            self._splice(tail.prev_free_block, blocks, tail)  # type: ignore[arg-type]

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put `blocks` at the head, in order (`blocks[0]` becomes the new head)."""
        if blocks:
            head = self.fake_free_list_head
            self._splice(head, blocks, head.next_free_block)  # type: ignore[arg-type]

    def _splice(
        self, prev: KVCacheBlock, blocks: Sequence[KVCacheBlock], nxt: KVCacheBlock
    ) -> None:
        """Link `blocks`, in order, between the adjacent nodes `prev` and `nxt`."""
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks, head (next to be handed out) first. O(n): for tests and checks."""
        out: list[KVCacheBlock] = []
        tail = self.fake_free_list_tail
        block = self.fake_free_list_head.next_free_block
        while block is not tail and block is not None:
            out.append(block)
            block = block.next_free_block
        return out

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter(self.get_all_free_blocks())
