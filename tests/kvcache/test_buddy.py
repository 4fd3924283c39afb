"""Exact state of the buddy and first-fit allocators after each operation."""

from __future__ import annotations

import pytest

from pagesim.errors import AllocationError, InternalError
from pagesim.kvcache.buddy import BuddyAllocator, FirstFitAllocator, Region, ceil_pow2


def _lists(b: BuddyAllocator) -> dict[int, list[int]]:
    """Non-empty free lists as {block size: starts}."""
    return {1 << k: list(lst) for k, lst in enumerate(b.free_lists) if lst}


def test_ceil_pow2():
    assert [ceil_pow2(n) for n in (1, 2, 3, 4, 5, 9, 16, 17)] == [1, 2, 4, 4, 8, 16, 16, 32]


def test_buddy_initial_cover_non_power_of_two():
    b = BuddyAllocator(13)  # 8 + 4 + 1
    assert _lists(b) == {8: [0], 4: [8], 1: [12]}
    b.check_invariants()
    assert b.num_free_units == 13


def test_buddy_split_and_merge_exact():
    b = BuddyAllocator(16)
    assert _lists(b) == {16: [0]}
    r1 = b.allocate(3)  # a block of 4 (16 -> 8+8 -> 4+4), split exactly: [0,2)+[2,3)
    assert r1 == Region(0, 3)
    assert _lists(b) == {1: [3], 4: [4], 8: [8]} and b.num_free_units == 13
    assert b.allocated == {0: 1, 2: 0} and b.regions == {0: 3}
    r2 = b.allocate(1)  # the smallest free block that holds it: the 1 at 3
    assert r2 == Region(3, 1)
    assert _lists(b) == {4: [4], 8: [8]}
    r3 = b.allocate(8)
    assert r3 == Region(8, 8)
    assert _lists(b) == {4: [4]}
    assert b.allocate(5) is None  # 4 units free, no block of 8: nothing changes
    assert _lists(b) == {4: [4]} and b.num_free_units == 4
    b.check_invariants()
    b.free(0)  # [2,3)'s buddy [3,4) is used; [0,2)'s buddy [2,4) is not whole: no merge
    assert _lists(b) == {1: [2], 2: [0], 4: [4]}
    b.free(3)  # [3,4) + [2,3) -> [2,4); + [0,2) -> [0,4); + [4,8) -> [0,8); [8,16) used: stop
    assert _lists(b) == {8: [0]}
    b.free(8)
    assert _lists(b) == {16: [0]}
    assert b.num_free_units == 16 and not b.allocated and not b.regions
    b.check_invariants()


def test_buddy_exact_region_frees_its_tail_at_once():
    b = BuddyAllocator(16)
    assert b.allocate(5) == Region(0, 5)  # block [0,8): region [0,4)+[4,5); tail [5,6)+[6,8)
    assert _lists(b) == {1: [5], 2: [6], 8: [8]} and b.num_free_units == 11
    assert b.allocate(3) == Region(8, 3)  # a block of 4 from [8,16): the 2 at 6 is too small
    assert _lists(b) == {1: [5, 11], 2: [6], 4: [12]} and b.num_free_units == 8
    assert b.usable_free(3) == 4 and b.usable_free(2) == 6 and b.usable_free(1) == 8
    assert not b.can_place(17) and b.can_place(9) and b.rounded_size(9) == 9
    b.check_invariants()
    b.free(8)
    b.free(0)
    assert _lists(b) == {16: [0]} and b.num_free_units == 16
    b.check_invariants()


def test_buddy_top_blocks_never_merge():
    b = BuddyAllocator(12)  # [0,8) + [8,12)
    r = b.allocate(4)
    assert r == Region(8, 4)  # smallest order that fits comes first
    b.free(8)
    assert _lists(b) == {8: [0], 4: [8]}  # parent [8,16) is outside: no merge
    b.check_invariants()


def test_buddy_lowest_address_first_and_usable_free():
    b = BuddyAllocator(16)
    a = [b.allocate(2) for _ in range(8)]
    assert [r.start for r in a] == [0, 2, 4, 6, 8, 10, 12, 14]
    for r in a[::2]:  # free every other pair: 8 units free in blocks of 2
        b.free(r.start)
    assert _lists(b) == {2: [0, 4, 8, 12]}
    assert b.usable_free(2) == 8 and b.usable_free(3) == 0 and b.usable_free(1) == 8
    assert b.allocate(3) is None
    b.check_invariants()


def test_buddy_errors():
    with pytest.raises(AllocationError, match="capacity=0"):
        BuddyAllocator(0)
    b = BuddyAllocator(8)
    with pytest.raises(InternalError, match="start=3"):
        b.free(3)
    with pytest.raises(InternalError, match="size=0"):
        b.allocate(0)
    assert b.allocate(9) is None


def test_first_fit_exact_and_coalescing():
    f = FirstFitAllocator(10)
    assert f.free_regions() == [Region(0, 10)]
    a, b, c = f.allocate(3), f.allocate(2), f.allocate(4)
    assert (a, b, c) == (Region(0, 3), Region(3, 2), Region(5, 4))
    assert f.free_regions() == [Region(9, 1)]
    f.free(0)
    assert f.free_regions() == [Region(0, 3), Region(9, 1)]
    assert f.allocate(4) is None  # 4 free units, largest hole 3
    assert f.usable_free(4) == 0 and f.usable_free(2) == 2 and f.usable_free(1) == 4
    f.free(5)  # merges right with [9,10)
    assert f.free_regions() == [Region(0, 3), Region(5, 5)]
    assert f.allocate(4) == Region(5, 4)  # first hole that fits, from its start
    assert f.free_regions() == [Region(0, 3), Region(9, 1)]
    f.free(5)
    f.free(3)  # merges left and right into one hole
    assert f.free_regions() == [Region(0, 10)]
    assert f.num_free_units == 10 and not f.allocated
    f.check_invariants()


def test_first_fit_prefers_lowest_hole():
    f = FirstFitAllocator(20)
    rs = [f.allocate(4) for _ in range(5)]
    f.free(rs[1].start)
    f.free(rs[3].start)
    assert f.free_regions() == [Region(4, 4), Region(12, 4)]
    assert f.allocate(2) == Region(4, 2)
    assert f.free_regions() == [Region(6, 2), Region(12, 4)]
    f.check_invariants()


def test_first_fit_errors():
    f = FirstFitAllocator(4)
    with pytest.raises(InternalError, match="start=1"):
        f.free(1)
    with pytest.raises(AllocationError, match="capacity=0"):
        FirstFitAllocator(0)


def test_invariant_checker_catches_corruption():
    b = BuddyAllocator(8)
    b.allocate(2)
    b.free_lists[1].append(0)  # a used block also on a free list
    with pytest.raises(AssertionError):
        b.check_invariants()
    f = FirstFitAllocator(8)
    f.allocate(2)
    f.num_free_units = 8
    with pytest.raises(AssertionError, match="num_free_units"):
        f.check_invariants()
