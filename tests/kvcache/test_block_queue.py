"""FreeKVCacheBlockQueue: exact order after every operation, O(1) unlinking, error cases."""

from __future__ import annotations

import pytest

from pagesim.errors import InternalError
from pagesim.kvcache.block import FreeKVCacheBlockQueue, KVCacheBlock


def make_queue(n: int = 6) -> tuple[list[KVCacheBlock], FreeKVCacheBlockQueue]:
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def assert_unlinked(block: KVCacheBlock) -> None:
    assert block.prev_free_block is None and block.next_free_block is None


def test_initial_order_is_ascending():
    blocks, queue = make_queue()
    assert ids(queue) == [0, 1, 2, 3, 4, 5]
    assert queue.num_free_blocks == len(queue) == 6
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    assert queue.fake_free_list_tail.prev_free_block is blocks[5]


def test_popleft_takes_the_head():
    blocks, queue = make_queue()
    assert queue.popleft() is blocks[0]
    assert_unlinked(blocks[0])
    assert [queue.popleft().block_id for _ in range(3)] == [1, 2, 3]
    for b in blocks[1:4]:
        assert_unlinked(b)
    assert ids(queue) == [4, 5]
    assert queue.num_free_blocks == 2
    assert [queue.popleft().block_id for _ in range(2)] == [4, 5]
    assert ids(queue) == [] and queue.num_free_blocks == 0
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail


def test_remove_from_middle_head_and_tail():
    blocks, queue = make_queue()
    queue.remove(blocks[3])
    assert ids(queue) == [0, 1, 2, 4, 5]
    queue.remove(blocks[0])
    queue.remove(blocks[5])
    assert ids(queue) == [1, 2, 4]
    assert queue.num_free_blocks == 3
    for b in (blocks[0], blocks[3], blocks[5]):
        assert_unlinked(b)


def test_append_append_n_prepend_n_order():
    blocks, queue = make_queue()
    taken = [queue.popleft() for _ in range(6)]
    queue.append(taken[2])
    assert ids(queue) == [2]
    queue.append_n([taken[4], taken[0]])
    assert ids(queue) == [2, 4, 0]
    queue.prepend_n([taken[5]])
    assert ids(queue) == [5, 2, 4, 0]
    queue.prepend_n([taken[1], taken[3]])  # blocks[0] of the argument becomes the head
    assert ids(queue) == [1, 3, 5, 2, 4, 0]
    assert queue.num_free_blocks == 6
    queue.append_n([])
    queue.prepend_n([])
    assert queue.num_free_blocks == 6
    # Backward links agree with forward ones.
    back = []
    b = queue.fake_free_list_tail.prev_free_block
    while b is not queue.fake_free_list_head:
        back.append(b.block_id)
        b = b.prev_free_block
    assert back == [0, 4, 2, 5, 3, 1]


def test_too_many_or_missing_blocks_raise_and_change_nothing():
    blocks, queue = make_queue(3)
    taken = queue.popleft()
    with pytest.raises(InternalError, match="block_id=0"):
        queue.remove(taken)
    queue.popleft()
    queue.popleft()
    with pytest.raises(InternalError, match="empty"):
        queue.popleft()


def test_repr_does_not_walk_the_queue():
    blocks, _ = make_queue(3)
    assert repr(blocks[1]) == "KVCacheBlock(block_id=1, ref_cnt=0, hashed=False, is_null=False)"
