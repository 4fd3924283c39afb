"""BlockPool: null block, allocation from the head, lazy eviction, touch, both free orders,
duplicates, usage, reset, events, and an invariant checker that can fail."""

from __future__ import annotations

import pytest

from pagesim.errors import ConfigError, InternalError
from pagesim.kvcache.block_pool import AllBlocksCleared, BlockPool, BlockRemoved, BlockStored
from pagesim.kvcache.invariants import InvariantViolation, check_block_pool


def h(i: int) -> bytes:
    return i.to_bytes(16, "little")


def queue_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def test_construction_and_null_block():
    pool = BlockPool(6)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert queue_ids(pool) == [1, 2, 3, 4, 5]
    assert pool.num_usable_blocks == pool.get_num_free_blocks() == 5
    assert pool.get_usage() == 0.0
    check_block_pool(pool)


@pytest.mark.parametrize("n", [0, 1, -3, 2.0])
def test_too_small_pool_is_a_config_error(n):
    with pytest.raises(ConfigError, match=r"num_gpu_blocks="):
        BlockPool(n)


def test_unknown_free_order_is_a_config_error():
    with pytest.raises(ConfigError, match="free_order='fifo'"):
        BlockPool(4, free_order="fifo")


def test_get_new_blocks_pops_from_the_head_and_fails_cleanly():
    pool = BlockPool(6)
    got = pool.get_new_blocks(2)
    assert ids(got) == [1, 2] and [b.ref_cnt for b in got] == [1, 1]
    assert queue_ids(pool) == [3, 4, 5]
    assert pool.get_usage() == pytest.approx(2 / 5)
    with pytest.raises(InternalError, match="num_blocks=4: only 3"):
        pool.get_new_blocks(4)
    assert queue_ids(pool) == [3, 4, 5]
    assert pool.get_new_blocks(0) == []
    check_block_pool(pool)


def test_lazy_eviction_on_reuse():
    pool = BlockPool(5, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(3)  # 1, 2, 3
    pool.cache_full_blocks(blocks, [h(10), h(11), h(12)], 0, 2)  # block 3 stays partial
    assert pool.take_events() == [BlockStored((1, 2), (h(10), h(11)))]
    pool.free_blocks(reversed(blocks))
    # 0.33 order: the unhashed block 3 to the head, hashed 2, 1 to the tail.
    assert queue_ids(pool) == [3, 4, 2, 1]
    assert pool.get_cached_block(h(11)) is blocks[1]  # still cached while free
    got = pool.get_new_blocks(3)  # 3, 4, 2: evicts block 2's hash only now
    assert ids(got) == [3, 4, 2]
    assert pool.get_cached_block(h(11)) is None and blocks[1].block_hash is None
    assert pool.get_cached_block(h(10)) is blocks[0]
    assert pool.take_events() == [BlockRemoved(2, h(11))]
    check_block_pool(pool)


def test_touch_takes_free_cached_blocks_out_of_the_queue():
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2)
    pool.free_blocks(reversed(blocks))
    assert queue_ids(pool) == [3, 4, 2, 1]
    pool.touch([blocks[0]])
    assert queue_ids(pool) == [3, 4, 2] and blocks[0].ref_cnt == 1
    pool.touch([blocks[0], pool.null_block])  # in use: only the count moves; null skipped
    assert blocks[0].ref_cnt == 2 and pool.null_block.ref_cnt == 0
    pool.free_blocks([blocks[0]])
    assert queue_ids(pool) == [3, 4, 2] and blocks[0].ref_cnt == 1
    pool.free_blocks([blocks[0]])
    assert queue_ids(pool) == [3, 4, 2, 1]
    check_block_pool(pool)


@pytest.mark.parametrize(
    "free_order, expected_queue",
    [
        # vLLM >= 0.24: unhashed 6, 5, 4 prepended (6 becomes the head), hashed 3, 1 appended.
        ("lifo_unhashed", [6, 5, 4, 7, 3, 1]),
        # vLLM <= 0.23: everything appended in the order given.
        ("classic", [7, 6, 5, 4, 3, 1]),
    ],
)
def test_free_orders(free_order, expected_queue):
    pool = BlockPool(8, free_order=free_order)
    blocks = pool.get_new_blocks(6)  # 1..6; 7 stays free
    pool.cache_full_blocks(blocks, [h(i) for i in range(6)], 0, 3)  # 1, 2, 3 hashed
    pool.touch([blocks[1]])  # block 2 has a second holder: not freed below
    by_id = {b.block_id: b for b in blocks}
    pool.free_blocks([by_id[i] for i in (6, 5, 4, 3, 2, 1)])  # a request's row, reversed
    assert queue_ids(pool) == expected_queue
    pool.free_blocks([by_id[2]])  # hashed: the tail in both orders
    assert queue_ids(pool) == expected_queue + [2]
    assert ids(pool.get_new_blocks(6)) == expected_queue  # handed out head first
    check_block_pool(pool)


def test_duplicates_are_kept_and_the_first_is_returned():
    pool = BlockPool(6)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([a], [h(9)], 0, 1)
    pool.cache_full_blocks([b, c], [h(9), h(9)], 0, 2)
    assert pool.get_cached_block(h(9)) is a
    assert set(pool.cached_block_hash_to_block[h(9)]) == {1, 2, 3}
    check_block_pool(pool)
    pool.free_blocks([a, b, c])
    pool.get_new_blocks(3)  # 4, 5, 1: a is evicted, b becomes the first
    assert pool.get_cached_block(h(9)) is b
    pool.get_new_blocks(1)  # 2
    assert pool.get_cached_block(h(9)) is c
    check_block_pool(pool)
    pool.get_new_blocks(1)
    assert pool.get_cached_block(h(9)) is None and pool.cached_block_hash_to_block == {}
    check_block_pool(pool)


def test_cache_full_blocks_skips_null_and_already_hashed_blocks():
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([pool.null_block, a], [h(1), h(2)], 0, 2)
    assert pool.null_block.block_hash is None and a.block_hash == h(2)
    pool.cache_full_blocks([a, b], [h(7), h(3)], 0, 2)  # a keeps its hash
    assert a.block_hash == h(2) and b.block_hash == h(3)
    check_block_pool(pool)


def test_caching_disabled_never_hashes():
    pool = BlockPool(4, enable_caching=False)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [h(1), h(2), h(3)], 0, 3)
    assert all(b.block_hash is None for b in blocks)
    pool.free_blocks(reversed(blocks))  # no hash anywhere: all to the head, in order
    assert queue_ids(pool) == [3, 2, 1]
    check_block_pool(pool)


def test_reset_prefix_cache_only_when_idle():
    pool = BlockPool(4, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2)
    pool.take_events()
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(h(1)) is blocks[0]
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block == {} and all(b.block_hash is None for b in blocks)
    assert pool.take_events() == [AllBlocksCleared()]
    assert queue_ids(pool) == [3, 2, 1]  # the order is kept
    check_block_pool(pool)


def test_invariant_checker_catches_corruption():
    def corrupt(how):
        pool = BlockPool(5)
        blocks = pool.get_new_blocks(2)
        pool.cache_full_blocks(blocks, [h(1), h(2)], 0, 2)
        how(pool, blocks)
        with pytest.raises(InvariantViolation):
            check_block_pool(pool)

    corrupt(lambda p, bs: setattr(bs[0], "ref_cnt", 0))  # used but count 0
    corrupt(lambda p, bs: setattr(p.blocks[4], "ref_cnt", 1))  # free but counted
    corrupt(lambda p, bs: setattr(bs[1], "ref_cnt", -1))
    corrupt(lambda p, bs: setattr(bs[0], "block_hash", h(5)))  # map disagrees
    corrupt(lambda p, bs: p.cached_block_hash_to_block.pop(h(2)))  # hashed but unmapped
    corrupt(lambda p, bs: setattr(p.free_block_queue, "num_free_blocks", 3))
    corrupt(lambda p, bs: setattr(p.blocks[4], "prev_free_block", p.blocks[1]))  # bad link
    corrupt(lambda p, bs: setattr(p.blocks[3], "next_free_block", None))  # cut queue
    corrupt(lambda p, bs: p.free_block_queue.append(p.null_block))  # null in the queue
