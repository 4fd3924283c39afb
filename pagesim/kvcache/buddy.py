"""Contiguous-region allocators over a line of `capacity` units: binary buddy and first-fit.

The contiguous KV baselines place each request's whole reservation in one run of units
(a unit is `block_size` token slots). These two placers are real allocators, so external
fragmentation comes out of the placement history rather than a formula:

- `BuddyAllocator`: a region of `size` units is placed in the lowest free block of the
  smallest order that holds it (ceil_pow2(size) units), split down as a buddy system does (a
  free block of order k splits into two buddies of order k-1); then the block is split
  exactly: the region keeps [start, start + size) as aligned power-of-two pieces and the
  tail goes back to the free lists at once (as Linux's `alloc_pages_exact` does), so an exact
  reservation stays exact and the rounding never shows as waste. On free, each piece merges
  with its buddy while the buddy is free and whole. The line need not be a power of two: it
  starts as the greedy cover of [0, capacity) by aligned power-of-two blocks
  (12 = [0,8) + [8,12)), and a merge happens only if the parent block lies inside the line,
  so those top blocks never merge with each other.

      order 3: [0 ............ 8)
      order 2: [0 .... 4)[4 .... 8)[8 .... 12)
      order 1: [0 2)[2 4)  ...           buddy of (start, k) = start ^ (1 << k)

      allocate(5) from [0, 8): region [0,4)+[4,5), tail [5,6)+[6,8) freed

- `FirstFitAllocator`: an address-ordered list of holes; an allocation takes the lowest hole
  that fits, from its start; a free coalesces with the holes on both sides.

Both choose by address only (lowest first), never by set order, so a run is reproducible.
Both return `Region(start, size)` or None when no free run is large enough (nothing changes).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import ClassVar, NamedTuple

from pagesim.errors import AllocationError, InternalError
from pagesim.kvcache.invariants import require


class Region(NamedTuple):
    """A run of units [start, start + size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def ceil_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


def aligned_cover(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) as the fewest aligned power-of-two blocks, left to right: (start, order)."""
    pieces = []
    while start < end:
        order = (end - start).bit_length() - 1
        if start:
            order = min(order, (start & -start).bit_length() - 1)
        pieces.append((start, order))
        start += 1 << order
    return pieces


class _Placer:
    """What both placers share: the line of `capacity` units, the free count, and sizes taken
    exactly as asked."""

    placement: ClassVar[str]

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise AllocationError(
                f"capacity={capacity}: a {self.placement} allocator needs >= 1 unit"
            )
        self.capacity = capacity
        self.num_free_units = capacity

    def rounded_size(self, size: int) -> int:
        """Units an allocation of `size` takes: exactly `size` (the buddy splits off the tail)."""
        return size


class BuddyAllocator(_Placer):
    """Binary buddy allocator. `free_lists[k]` holds the sorted starts of free blocks of 2**k."""

    placement = "buddy"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.max_order = capacity.bit_length() - 1
        self.free_lists: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        self.allocated: dict[int, int] = {}  # start -> order, one entry per allocated piece
        self.regions: dict[int, int] = {}  # region start -> size (units)
        for start, order in aligned_cover(0, capacity):
            self.free_lists[order].append(start)

    def can_place(self, size: int) -> bool:
        """Whether an empty line could place `size` units: a block of ceil_pow2(size) fits."""
        return 1 <= size and (size - 1).bit_length() <= self.max_order

    def region_size(self, start: int) -> int | None:
        """Units of the region allocated at `start`, None if none starts there."""
        return self.regions.get(start)

    def allocate(self, size: int) -> Region | None:
        """The lowest free block of the smallest order that fits, split down to
        ceil_pow2(size), then split exactly: [start, start + size) is kept, the rest freed."""
        if size < 1:
            raise InternalError(f"size={size}: allocate at least one unit")
        order = (size - 1).bit_length()
        j = order
        while j <= self.max_order and not self.free_lists[j]:
            j += 1
        if j > self.max_order:
            return None
        start = self.free_lists[j].pop(0)
        while j > order:  # keep the lower half, free the upper buddy
            j -= 1
            insort(self.free_lists[j], start + (1 << j))
        for piece, k in aligned_cover(start, start + size):
            self.allocated[piece] = k
        # the tail's greedy pieces are maximal: no two are buddies, none merges yet
        for piece, k in aligned_cover(start + size, start + (1 << order)):
            insort(self.free_lists[k], piece)
        self.regions[start] = size
        self.num_free_units -= size
        return Region(start, size)

    def free(self, start: int) -> None:
        """Return the region at `start`: each piece merges with free buddies as far as they go."""
        size = self.regions.pop(start, None)
        if size is None:
            raise InternalError(f"start={start}: no allocated buddy region starts there")
        for piece, order in reversed(aligned_cover(start, start + size)):
            del self.allocated[piece]
            self._free_block(piece, order)

    def _free_block(self, start: int, order: int) -> None:
        self.num_free_units += 1 << order
        while order < self.max_order:
            parent = start & ~(1 << order)
            if parent + (2 << order) > self.capacity:
                break  # parent sticks out of the line: a top block
            buddy = start ^ (1 << order)
            lst = self.free_lists[order]
            i = bisect_left(lst, buddy)
            if i == len(lst) or lst[i] != buddy:
                break
            del lst[i]
            start, order = parent, order + 1
        insort(self.free_lists[order], start)

    def usable_free(self, size: int) -> int:
        """Free units that allocations of `size` could take: every free block of order >=
        that of ceil_pow2(size) splits exactly into such blocks; smaller ones are useless."""
        order = (size - 1).bit_length()
        return sum(len(self.free_lists[k]) << k for k in range(order, self.max_order + 1))

    def free_regions(self) -> list[Region]:
        """Free blocks in address order."""
        return sorted(Region(s, 1 << k) for k, lst in enumerate(self.free_lists) for s in lst)

    def check_invariants(self) -> None:
        """Free + used == capacity; blocks aligned, inside the line, disjoint; no free buddy pair
        left unmerged; free lists sorted. Raises InvariantViolation naming the first violation."""
        blocks = [(s, 1 << k, True) for k, lst in enumerate(self.free_lists) for s in lst]
        blocks += [(s, 1 << k, False) for s, k in self.allocated.items()]
        blocks.sort()
        pos = 0
        for s, n, _ in blocks:
            require(s == pos, f"gap or overlap at unit {pos} (next block starts at {s})")
            require(s % n == 0, f"block ({s}, {n}) is not aligned")
            pos = s + n
        require(pos == self.capacity, f"blocks cover {pos} units, capacity is {self.capacity}")
        free = sum(n for _, n, is_free in blocks if is_free)
        require(free == self.num_free_units, f"num_free_units={self.num_free_units}, lists={free}")
        pieces = {p: k for s, n in self.regions.items() for p, k in aligned_cover(s, s + n)}
        require(pieces == self.allocated, "allocated pieces do not tile the regions")
        for k, lst in enumerate(self.free_lists):
            require(lst == sorted(set(lst)), f"free list {k} unsorted or duplicated")
            members = set(lst)
            for s in lst:
                parent = s & ~(1 << k)
                if parent + (2 << k) <= self.capacity and k < self.max_order:
                    require((s ^ (1 << k)) not in members, f"free buddies ({s}, {1 << k}) unmerged")


class FirstFitAllocator(_Placer):
    """First-fit over an address-ordered hole list with coalescing on free."""

    placement = "first-fit"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.hole_starts: list[int] = [0]  # sorted
        self.hole_size: dict[int, int] = {0: capacity}
        self.allocated: dict[int, int] = {}  # start -> size

    def can_place(self, size: int) -> bool:
        """Whether an empty line could place `size` units."""
        return 1 <= size <= self.capacity

    def region_size(self, start: int) -> int | None:
        """Units of the run allocated at `start`, None if none starts there."""
        return self.allocated.get(start)

    @property
    def regions(self) -> dict[int, int]:
        """Run start -> size (units)."""
        return self.allocated

    def allocate(self, size: int) -> Region | None:
        """Carve `size` units from the start of the lowest hole that holds them."""
        if size < 1:
            raise InternalError(f"size={size}: allocate at least one unit")
        for i, start in enumerate(self.hole_starts):
            hole = self.hole_size[start]
            if hole >= size:
                del self.hole_size[start]
                if hole == size:
                    del self.hole_starts[i]
                else:
                    self.hole_starts[i] = start + size
                    self.hole_size[start + size] = hole - size
                self.allocated[start] = size
                self.num_free_units -= size
                return Region(start, size)
        return None

    def free(self, start: int) -> None:
        """Return the run at `start`; merge it with an adjacent hole on either side."""
        size = self.allocated.pop(start, None)
        if size is None:
            raise InternalError(f"start={start}: no allocated run starts there")
        self.num_free_units += size
        i = bisect_left(self.hole_starts, start)
        end = start + size
        if i < len(self.hole_starts) and self.hole_starts[i] == end:  # merge right
            size += self.hole_size.pop(end)
            del self.hole_starts[i]
        if i > 0:
            left = self.hole_starts[i - 1]
            if left + self.hole_size[left] == start:  # merge left
                self.hole_size[left] += size
                return
        self.hole_starts.insert(i, start)
        self.hole_size[start] = size

    def usable_free(self, size: int) -> int:
        """Free units that allocations of `size` could take: floor(hole / size) * size per hole."""
        return sum(h - h % size for h in self.hole_size.values())

    def free_regions(self) -> list[Region]:
        return [Region(s, self.hole_size[s]) for s in self.hole_starts]

    def check_invariants(self) -> None:
        """Holes sorted, disjoint and never adjacent (coalesced); holes + runs tile the line."""
        require(self.hole_starts == sorted(self.hole_size), "hole list and sizes disagree")
        runs = [(s, n, True) for s, n in self.hole_size.items()]
        runs += [(s, n, False) for s, n in self.allocated.items()]
        runs.sort()
        pos, prev_free = 0, False
        for s, n, is_free in runs:
            require(s == pos, f"gap or overlap at unit {pos} (next run starts at {s})")
            require(n >= 1, f"empty run at {s}")
            require(not (is_free and prev_free), f"adjacent holes at {s} not coalesced")
            pos, prev_free = s + n, is_free
        require(pos == self.capacity, f"runs cover {pos} units, capacity is {self.capacity}")
        free = sum(self.hole_size.values())
        require(free == self.num_free_units, f"num_free_units={self.num_free_units}, holes={free}")


PLACEMENTS: dict[str, type[BuddyAllocator] | type[FirstFitAllocator]] = {
    "buddy": BuddyAllocator,
    "first-fit": FirstFitAllocator,
}
