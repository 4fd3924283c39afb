"""Contiguous KV allocation: the "traditional engine" baselines of the vLLM paper.

Each request gets one contiguous region of the KV cache at its first `allocate_slots`, sized
by a policy from what is known at admission, and keeps it until `free`:

    reserve-max  max_model_len slots (the length is unknown in advance)
    pow2         prompt + max_tokens rounded up to a power of two, at most max_model_len
    oracle       exactly prompt + max_tokens (`request.max_num_tokens`), at most max_model_len

The region is placed by a real allocator over the line of usable blocks (`buddy.py`: binary
buddy, as the vLLM paper assumes for Orca, or first-fit with coalescing), so external
fragmentation comes from the placement history. The unit of placement is one block of
`block_size` slots, so region sizes round up to whole blocks (`block_size=1` gives
token-granular regions); neither placer rounds further (the buddy splits its block exactly),
so `oracle` reserves exactly what a request will fill, under either placement.

Same calling shape as the paged `KVCacheManager`: the scheduler cannot tell them apart.
Block ids: block 0 stays the null block, as in the paged pool; unit u of the line is block
u + 1. A request's block-table row is the prefix of its region that holds or is about to hold
tokens, consecutive ids from the region's first block (the rest is reserved, not in the row):

    line:   | null | A A A A A A A A | B B B B | free ... |
    ids:       0     1 2 3 4 5 6 7 8   9 ...
    row(A) = [1, 2, 3] after 40 tokens with block_size 16; region A = blocks 1..8

No prefix caching: `get_computed_blocks` returns nothing, prefix stats count queries only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pagesim.errors import AllocationError, ConfigError, InternalError
from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.buddy import PLACEMENTS, Region, ceil_pow2
from pagesim.kvcache.invariants import require
from pagesim.kvcache.kv_cache_manager import KVCacheBlocks
from pagesim.kvcache.prefix_stats import PrefixCacheStats, PrefixStatsCounters
from pagesim.kvcache.slot_allocator import SlotAllocator, SlotExtras
from pagesim.request import Request

POLICIES: tuple[str, ...] = ("reserve-max", "pow2", "oracle")


@dataclass(slots=True)
class Reservation:
    """One request's region. Sizes in units (blocks); `final_kv_len` in tokens."""

    request: Request
    region: Region  # units [start, start + size) of the line; block ids start + 1 ...
    row: list[int]  # block-table row: ids of the region's first len(row) blocks
    final_kv_len: int  # slots the request will ever fill: prompt + max_tokens - 1


class ContiguousKVCacheManager(SlotAllocator[KVCacheBlocks], PrefixStatsCounters):
    """One contiguous region per request over `num_gpu_blocks - 1` usable blocks.

    `policy` sizes the region, `placement` ("buddy" | "first-fit") places it. With
    `check_invariants`, every mutating call ends with `check_invariants()` (slow).
    """

    # One region per request: its waste split reads the head of the waiting queue (external
    # fragmentation is the free space that request's region cannot use).
    is_contiguous: ClassVar[bool] = True

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        policy: str = "reserve-max",
        placement: str = "buddy",
        *,
        max_model_len: int,
        check_invariants: bool = False,
    ) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"policy={policy!r}: choose one of {', '.join(POLICIES)}")
        if placement not in PLACEMENTS:
            raise ConfigError(f"placement={placement!r}: choose one of {', '.join(PLACEMENTS)}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size={block_size!r}: must be an int >= 1")
        if num_gpu_blocks < 2:
            raise ConfigError(f"num_gpu_blocks={num_gpu_blocks}: need >= 2 (one is the null block)")
        if max_model_len < 1:
            raise ConfigError(f"max_model_len={max_model_len!r}: must be >= 1")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.policy = policy
        self.placement = placement
        self.max_model_len = max_model_len
        self.enable_caching = False
        self.check_invariants_after_ops = check_invariants
        self.allocator = PLACEMENTS[placement](num_gpu_blocks - 1)
        self.reservations: dict[str, Reservation] = {}
        # Running sums over reservations, kept in step for the waste accountant (slots).
        self.num_reserved_slots = 0  # sum of region sizes
        self.num_fillable_slots = 0  # sum of min(region size, final_kv_len)
        self._blocks = [KVCacheBlock(block_id=i, is_null=i == 0) for i in range(num_gpu_blocks)]
        self.prefix_cache_stats = PrefixCacheStats()
        self._interval_stats = PrefixCacheStats()
        self.empty_kv_cache_blocks = KVCacheBlocks(())

    # ---- sizing ----------------------------------------------------------------------------
    def region_tokens(self, final_len: int) -> int:
        """Slots the policy asks for a request whose final length is `final_len` tokens."""
        if self.policy == "reserve-max":
            tokens = self.max_model_len
        elif self.policy == "pow2":
            tokens = ceil_pow2(final_len)
        else:
            tokens = final_len
        return min(tokens, self.max_model_len)

    def region_units(self, final_len: int) -> int:
        """Blocks the placed region takes (policy, rounded to blocks and by the allocator)."""
        return self.allocator.rounded_size(-(-self.region_tokens(final_len) // self.block_size))

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a request of final length `num_tokens` could get its region in an empty
        cache (schedulers reject requests for which this is False)."""
        return self.allocator.can_place(self.region_units(num_tokens))

    def can_fit_request(self, request: Request) -> bool:
        return self.can_fit(request.max_num_tokens)

    # ---- read-only views -------------------------------------------------------------------
    @property
    def usage(self) -> float:
        """Reserved blocks / usable blocks (a whole region counts from its admission)."""
        a = self.allocator
        return 1.0 - a.num_free_units / a.capacity

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free_units

    @property
    def num_usable_blocks(self) -> int:
        return self.allocator.capacity

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block-table row: the live list, callers must not mutate it."""
        res = self.reservations.get(request_id)
        return res.row if res is not None else []

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks([self._blocks[i] for i in self.get_block_ids(request_id)])

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """No prefix caching: never a hit."""
        return self.empty_kv_cache_blocks, 0

    # ---- allocation ------------------------------------------------------------------------
    def _allocate_slots(
        self, request: Request, num_new_tokens: int, extras: SlotExtras[KVCacheBlocks]
    ) -> KVCacheBlocks | None:
        """Reserve the request's region on its first call; later calls only extend the row.

        Returns the blocks newly added to the row, or None when no free run holds the region
        (nothing changed). `full_sequence_must_fit` changes nothing: the region always
        covers the whole sequence. Raises `AllocationError` for a region that could never be
        placed, and `InternalError` for what breaks the contract: `num_new_tokens < 1`, a
        prefix hit (there is no cache), a running request outgrowing its region.
        """
        rid = request.request_id
        if num_new_tokens < 1:
            raise InternalError(f"num_new_tokens={num_new_tokens}: must be >= 1 (request {rid!r})")
        if extras.num_new_computed_tokens or extras.new_computed_blocks:
            raise InternalError(
                f"num_new_computed_tokens={extras.num_new_computed_tokens}: "
                "contiguous allocation has no prefix cache"
            )
        need = min(
            request.num_computed_tokens + num_new_tokens + extras.num_lookahead_tokens,
            self.max_model_len,
        )
        res = self.reservations.get(rid)
        if res is None:
            res = self._reserve(request)
            if res is None:
                return None
        elif need > res.region.size * self.block_size:
            raise InternalError(
                f"num_new_tokens={num_new_tokens}: request {rid!r} needs {need} slots, its "
                f"{self.policy} region holds {res.region.size * self.block_size}"
            )
        new_len = -(-need // self.block_size)
        row = res.row
        if new_len <= len(row):
            result = self.empty_kv_cache_blocks
        else:
            first = res.region.start + 1 + len(row)
            new_ids = range(first, first + new_len - len(row))
            row.extend(new_ids)
            result = KVCacheBlocks(self._blocks[first : first + len(new_ids)])
        if self.check_invariants_after_ops:
            self.check_invariants()
        return result

    def _reserve(self, request: Request) -> Reservation | None:
        rid = request.request_id
        final_len = request.max_num_tokens
        units = -(-self.region_tokens(final_len) // self.block_size)
        if not self.can_fit(final_len):
            raise AllocationError(
                f"request {rid!r}: its {self.policy} region of {self.region_units(final_len)} "
                f"blocks can never be placed in {self.allocator.capacity} usable blocks "
                f"({self.placement})"
            )
        region = self.allocator.allocate(units)
        if region is None:
            return None
        res = Reservation(request, region, [], final_len - 1)
        self.reservations[rid] = res
        slots = region.size * self.block_size
        self.num_reserved_slots += slots
        self.num_fillable_slots += min(slots, res.final_kv_len)
        self._record_admission(request, 0)
        return res

    def free(self, request: Request) -> None:
        """Give the request's region back (a no-op if it holds none)."""
        res = self.reservations.pop(request.request_id, None)
        if res is not None:
            self.allocator.free(res.region.start)
            slots = res.region.size * self.block_size
            self.num_reserved_slots -= slots
            self.num_fillable_slots -= min(slots, res.final_kv_len)
        if self.check_invariants_after_ops:
            self.check_invariants()

    def decode_row_blocks(self, request_id: str) -> int | None:
        """Blocks of the request's block-table row (its region's first ones); None when it
        holds no region. The paged manager's query: nothing is shared here."""
        res = self.reservations.get(request_id)
        return None if res is None else len(res.row)

    # ---- the paged manager's other entry points --------------------------------------------
    num_blocks_to_copy = 0  # no sharing, so no copy-on-write
    rewritten_req_ids: frozenset[str] = frozenset()  # rows only grow

    def take_blocks_to_copy(self) -> list[tuple[int, int]]:
        return []  # no sharing, so no copy-on-write

    def fork(self, parent: Request, child: Request) -> None:
        raise AllocationError(
            f"parent={parent.request_id!r}: contiguous allocation cannot "
            "share regions (parallel sampling needs the paged manager)"
        )

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """No sliding-window release: the region is reserved whole."""

    def reset_prefix_cache(self) -> bool:
        self.prefix_cache_stats.reset = self._interval_stats.reset = True
        return True

    def take_events(self) -> list:
        return []

    # ---- invariants ------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise `InvariantViolation` on the first broken invariant: the allocator's own (free
        + used == capacity, regions disjoint and tiling the line, buddy lists merged); each
        reservation's region is allocated with its size; rows are consecutive region prefixes;
        the running sums match; with no reservation, the line is whole again (nothing leaked)."""
        a = self.allocator
        a.check_invariants()
        bs = self.block_size
        require(
            len(a.regions) == len(self.reservations),
            f"{len(a.regions)} regions allocated, {len(self.reservations)} reservations",
        )
        reserved = fillable = 0
        for rid, res in self.reservations.items():
            start, size = res.region
            held = a.region_size(start)
            require(
                held == size,
                f"request {rid!r}: region {res.region} is not allocated with that size",
            )
            require(
                res.row == list(range(start + 1, start + 1 + len(res.row))),
                f"request {rid!r}: row is not a prefix of its region",
            )
            require(len(res.row) <= size, f"request {rid!r}: row longer than its region")
            reserved += size * bs
            fillable += min(size * bs, res.final_kv_len)
        require(
            reserved == self.num_reserved_slots,
            f"num_reserved_slots={self.num_reserved_slots}, regions hold {reserved}",
        )
        require(
            fillable == self.num_fillable_slots,
            f"num_fillable_slots={self.num_fillable_slots}, regions allow {fillable}",
        )
        require(a.num_free_units * bs + reserved == a.capacity * bs, "free + used != total")
        if not self.reservations:
            require(a.num_free_units == a.capacity, "blocks leaked after all frees")
            fresh = type(a)(a.capacity)
            require(
                a.free_regions() == fresh.free_regions(),
                "free space not merged back into the initial regions",
            )
