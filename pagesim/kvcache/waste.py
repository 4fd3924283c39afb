"""Where the KV memory goes, split as the vLLM paper does (its Fig. 2), and its time average.

At one instant the usable KV slots (null block excluded) fall in five disjoint parts:

    token_states            slots holding K/V: the running requests' computed tokens, counted
                            once per physical slot (prefix-shared blocks once, blocks freed by a
                            sliding window not at all)
    reserved                allocated slots that tokens still to come will fill, up to the
                            request's final K/V length
    internal_fragmentation  allocated slots never to be filled: beyond the final K/V length
                            (the tail of the last paged block; the rest of a contiguous region)
    external_fragmentation  free slots that cannot be used (definition below)
    free                    the other free slots

The final K/V length of a request is `prompt + max_tokens - 1`: the last sampled token is
returned but never fed back, so its K/V is never written (requests run to max_tokens, as
`vllm bench serve --ignore-eos` does).

External fragmentation, precisely: free slots that the *next allocation* cannot use, the next
allocation being the region of the head-of-queue request (`next_request`). For a contiguous
manager, the usable free space is what regions of that size could take: every buddy block of
at least that order, floor(hole / size) * size of each first-fit hole; the rest of the free
space is external fragmentation. With no request waiting nothing is blocked, and it is 0.
Paged: any free block serves any request, so it is 0 (the paper's point).

Cost per snapshot: O(running requests) with one attribute read or two per request; the
contiguous manager keeps its region sums up to date as it allocates and frees. Callers that keep
the running requests' sums themselves (the simulator's bulk decodes) pass them in
(`paged_waste_from_tails`, `contiguous_slots(..., tokens=)`) and pay O(1).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from pagesim.errors import ConfigError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.request import Request

# (kv_usage, token_state, reserved, internal_frag, external_frag): fractions of KV memory
ProbeValues = tuple[float, float, float, float, float]


class KVProbe(Protocol):
    """The KV snapshot an engine takes after each step, in either world: the simulator's
    time-weighted `pagesim.sim.probe.WasteProbe`, or the GPU replay's `UsageProbe`."""

    def __call__(self) -> ProbeValues: ...


class UsageProbe:
    """The `KVProbe` of a run that measures usage only (the GPU replay): the waste split is
    the simulator's, NaN here."""

    def __init__(self, manager) -> None:
        self.manager = manager

    def __call__(self) -> ProbeValues:
        nan = float("nan")
        return float(self.manager.usage), nan, nan, nan, nan


class KVWaste(NamedTuple):
    """Fractions of the usable KV slots at one instant (or time-averaged); they sum to 1."""

    token_states: float
    reserved: float
    internal_fragmentation: float
    external_fragmentation: float
    free: float


@dataclass(frozen=True, slots=True)
class KVSlots:
    """The same split in token slots; `total` = usable blocks * block_size."""

    total: int
    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int

    def fractions(self) -> KVWaste:
        t = self.total
        return KVWaste(
            self.token_states / t,
            self.reserved / t,
            self.internal_fragmentation / t,
            self.external_fragmentation / t,
            self.free / t,
        )


def contiguous_slots(
    manager: ContiguousKVCacheManager,
    next_request: Request | None = None,
    tokens: int | None = None,
) -> KVSlots:
    """The split for a contiguous manager; `next_request` is the head of the waiting queue.

    `tokens`: the sum of `num_computed_tokens` over the requests holding regions, when the
    caller keeps it up to date (the simulator's bulk decodes); summed here when None.
    """
    bs = manager.block_size
    alloc = manager.allocator
    if tokens is None:
        tokens = 0
        for res in manager.reservations.values():
            tokens += res.request.num_computed_tokens
    fillable = manager.num_fillable_slots
    free_units = alloc.num_free_units
    external = 0
    if next_request is not None and free_units:
        need = manager.region_units(next_request.max_num_tokens)
        external = (free_units - alloc.usable_free(need)) * bs
    free = free_units * bs
    return KVSlots(
        total=alloc.capacity * bs,
        token_states=tokens,
        reserved=fillable - tokens,
        internal_fragmentation=manager.num_reserved_slots - fillable,
        external_fragmentation=external,
        free=free - external,
    )


def paged_slots(manager, running: Iterable[Request]) -> KVSlots:
    """The split for the paged `KVCacheManager`; `running` are the requests holding blocks.

    Each request's row covers positions [0, len(row) * block_size); its unfilled tail
    `len(row) * block_size - num_computed_tokens` is reserved up to the final K/V length and
    internal fragmentation beyond. Every other used slot holds K/V, counted once however many
    requests share it: token_states = used slots - tails.
    """
    return paged_slots_from_tails(manager, *paged_tails(manager, running))


def paged_tails(manager, running: Iterable[Request]) -> tuple[int, int]:
    """(reserved, internal fragmentation) slots of the requests' row tails (see `paged_slots`),
    summed over every KV cache group's row under the hybrid manager."""
    groups = getattr(manager, "single_type_managers", None)
    if groups is not None:
        running = list(running)
        sums = [_row_tails(g.req_to_block_ids, g.block_size, running) for g in groups]
        return sum(r for r, _ in sums), sum(i for _, i in sums)
    return _row_tails(manager.req_to_block_ids, manager.block_size, running)


def _row_tails(rows: dict[str, list[int]], bs: int, running: Iterable[Request]) -> tuple[int, int]:
    """The tails of one table's rows (read-only; the hot loop skips a method call per row)."""
    reserved = internal = 0
    for request in running:
        row = rows.get(request.request_id)
        if not row:
            continue
        span = len(row) * bs
        computed = request.num_computed_tokens
        final = len(request.prompt_token_ids) + request.max_tokens - 1
        fill_to = span if span < final else (final if final > computed else computed)
        reserved += fill_to - computed
        internal += span - fill_to
    return reserved, internal


def paged_slots_from_tails(manager, reserved: int, internal: int) -> KVSlots:
    """The paged split from the running requests' summed tails (see `paged_slots`): `reserved`
    and `internal` slots, in tokens. For callers that keep those sums up to date themselves."""
    total, tokens, reserved, internal, free = _paged_split(manager, reserved, internal)
    return KVSlots(
        total=total,
        token_states=tokens,
        reserved=reserved,
        internal_fragmentation=internal,
        external_fragmentation=0,
        free=free,
    )


def paged_waste_from_tails(manager, reserved: int, internal: int) -> KVWaste:
    """`paged_slots_from_tails(...).fractions()`, without the intermediate record (hot path)."""
    total, tokens, reserved, internal, free = _paged_split(manager, reserved, internal)
    return KVWaste(tokens / total, reserved / total, internal / total, 0 / total, free / total)


def _paged_split(manager, reserved: int, internal: int) -> tuple[int, int, int, int, int]:
    """(total, token states, reserved, internal fragmentation, free) slots."""
    pool, bs = manager.block_pool, manager.block_size
    usable = pool.num_usable_blocks
    used = (usable - pool.free_block_queue.num_free_blocks) * bs
    tokens = used - reserved - internal
    if tokens < 0:  # tails shared by forked requests counted twice; never below zero
        internal += tokens
        tokens = 0
    total = usable * bs
    return total, tokens, reserved, internal, total - used


def kv_slots(
    manager, running: Iterable[Request] | None = None, next_request: Request | None = None
) -> KVSlots:
    """The split for either manager. The paged one needs `running`; the contiguous one knows
    its holders and uses `next_request` (head of the waiting queue) for external fragmentation."""
    if manager.is_contiguous:
        return contiguous_slots(manager, next_request)
    if running is None:
        raise ConfigError("running=None: the paged manager's split needs the running requests")
    return paged_slots(manager, running)


def kv_waste(
    manager, running: Iterable[Request] | None = None, next_request: Request | None = None
) -> KVWaste:
    """`kv_slots(...)` as fractions of the usable KV slots."""
    return kv_slots(manager, running, next_request).fractions()


class WasteAverager:
    """Time-weighted mean of snapshots: `add(snapshot, duration_s)` once per simulated step,
    with the time the state lasted. O(1) per add."""

    __slots__ = ("duration_s", "_sums", "max_used")

    def __init__(self) -> None:
        self.duration_s = 0.0
        self._sums = [0.0] * len(KVWaste._fields)
        self.max_used = 0.0  # peak of token states + reserved + internal fragmentation

    def add(self, snapshot: KVWaste | KVSlots, duration_s: float) -> None:
        if duration_s < 0:
            raise ConfigError(f"duration_s={duration_s}: must be >= 0")
        w = snapshot.fractions() if isinstance(snapshot, KVSlots) else snapshot
        tokens, reserved, internal, external, free = w
        sums = self._sums
        sums[0] += tokens * duration_s
        sums[1] += reserved * duration_s
        sums[2] += internal * duration_s
        sums[3] += external * duration_s
        sums[4] += free * duration_s
        self.duration_s += duration_s
        used = tokens + reserved + internal
        if used > self.max_used:
            self.max_used = used

    def mean(self) -> KVWaste | None:
        """The time-weighted mean, or None before any time has passed."""
        if self.duration_s <= 0:
            return None
        d = self.duration_s
        return KVWaste(*(s / d for s in self._sums))
