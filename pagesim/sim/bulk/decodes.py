"""Bulk decodes: the simulator accounts a step's routine decodes together, so that a step
costs O(requests that have something to do).

Near saturation a step gives each of ~50 running requests one decode token, and for almost all
of them that is all that happens: `allocate_slots` neither takes a block nor fills one, the
request does not finish, and its new token only moves counters forward by one. Such requests
are decoded *in bulk* (bulk requests): their counters are not touched in those steps, and are
brought up to date exactly when anything can read them.

Bulk requests are always the first `n` requests of the running list (requests join the
running list at its end, so this prefix only shrinks when a bulk request finishes). In a bulk
request's steps its state is a function of the tick (bulk-step counter) `g`:

    num_computed_tokens at the start of tick g     = offset + g             (= c)
    output tokens at the start of tick g           = c + 1 - prompt_len     (decode shape)
    record.last_token_time / num_output_tokens     = end of the last tick / + 1 per tick

Its *events* are the ticks at which the per-request path would do more than count: `alloc_at`
(c at which `allocate_slots` takes a block: c == row span), `hash_at` (c at which the step
fills a block, hashed for the prefix cache: (c + 1) // block_size > cached blocks) and
`finish_at` (c of the step that samples its last token). Events run in running order, at the
same point of the step as on the per-request path; in the other steps the skipped
`allocate_slots(request, 1)` calls are no-ops. On a paged manager the common events do exactly
what that call would do without bringing the request up to date: `append_decode_blocks` (a
block at the end of each row) and `cache_decode_block` (the block it fills, cached from its
tokens: output tokens are windows of one `SyntheticTokenTable`, so a block's int32 bytes are
one slice; with deferred hashes they are kept, and hashed only if a lookup can see the block).
Other events bring the request up to date and call the real `allocate_slots`; a finishing
request is brought up to date for `Scheduler.finish_bulk_decodes`. Output tokens are appended
only then (and at `dissolve`), a run at a time.

With deferred hashes, a bulk request whose first block is cached has no `hash_at` events at
all: the blocks it fills join the prefix cache in one call, when it finishes or is brought up
to date, or when anything else is about to read or change its root's group of deferred blocks
(`pagesim.sim.bulk.fills` says why that is exact). Its only events are then a block appended
every `block_size` steps and its finish.

A step is a bulk step when at least one running request is a bulk request and nothing the bulk
requests do in it can differ from the per-request path: every bulk request gets its token (they
are at most `max_num_batched_tokens`), their block allocations cannot fail (the blocks they
need now are free), and no request behind them can preempt one of them (fcfs preempts from the
end of the running list; under `priority` the step must have no other running request). The
rest of the step (the other running requests, swap-ins, admissions) goes through
`Scheduler.schedule_bulk` with the budget the bulk requests left. Any other step is a
per-request step: every bulk request is brought up to date first (`dissolve`).

The time-weighted waste split needs, after each step, sum(computed), sum(min(span, final)) and
sum(span - min(span, final)) over the bulk requests (`WasteProbe.with_bulk_sums`): the first is
`sum(offset) + n * g`, the other two change only at allocation events.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from pagesim.config import EngineConfig
from pagesim.errors import InternalError
from pagesim.metrics.collector import RequestRecord
from pagesim.request import Request
from pagesim.scheduler.output import SyntheticTokenTable, synthetic_tokens
from pagesim.scheduler.scheduler import Scheduler
from pagesim.sim.bulk.fills import BulkFills
from pagesim.sim.runner import CostModelRunner

_by_seq = attrgetter("seq")


def _pack_tokens(tokens: list[int]) -> bytes | None:
    """Token ids as little-endian int32, the packing block hashes use; None if one does not
    fit."""
    try:
        return struct.pack(f"<{len(tokens)}i", *tokens)
    except struct.error:
        return None


_NEVER = 1 << 62  # an event position that is never reached (no prefix caching)


@dataclass(slots=True, eq=False)
class _BulkRequest:
    """One bulk request. Positions (`*_at`) are num_computed_tokens at the start of a step."""

    request: Request
    rid: str  # request.request_id
    record: RequestRecord
    seq: int  # running order among bulk requests
    offset: int  # num_computed_tokens at the start of tick g is offset + g
    g0: int  # the tick it became a bulk request at
    num_record_tokens0: int  # record.num_output_tokens then
    prompt_len: int
    final: int  # final K/V length: prompt + max_tokens - 1
    span: int  # slots of its block-table row (paged) or of its row (contiguous)
    alloc_at: int  # == span: that step's token needs a new block
    hash_at: int  # that step's token fills a block (prefix caching); _NEVER without caching
    # or while its filled blocks wait in `BulkFills`
    finish_at: int  # that step samples its last token
    tok0: int  # the synthetic token table's index of its output token 0 (0 without a table)
    done: bool = False
    root: bytes | None = None  # its first block's hash while its filled blocks wait in `BulkFills`


class BulkDecodes:
    """The bulk requests of one replica and their events (see the module docstring)."""

    def __init__(
        self, scheduler: Scheduler, runner: CostModelRunner, records, *, paged: bool
    ) -> None:
        """`paged`: the scheduler's manager is the paged one (else a contiguous baseline)."""
        manager = scheduler.kv_cache_manager
        self.scheduler = scheduler
        self.runner = runner  # the engine's runner: it prices the steps of bulk decodes
        self.manager = manager
        self.records: dict[str, RequestRecord] = records
        self.vocab_size = runner.vocab_size
        table = SyntheticTokenTable(runner.vocab_size)
        self.table = table if table.usable else None  # output tokens as table windows
        self.paged = paged
        self.caching = self.paged and manager.enable_caching
        self.block_size = manager.block_size
        self.max_model_len = scheduler.max_model_len
        self.budget = scheduler.max_num_batched_tokens
        self.priority = scheduler.policy == "priority"
        # Events go straight to the manager's decode-block calls (see `_run_events`).
        self.direct = self.paged and self.table is not None and self.block_size <= self.vocab_size
        self.tick = 0  # bulk steps so far
        self.last_tick_time = 0.0  # end of the last bulk step
        self.members: list[_BulkRequest] = []  # running order
        self.offsets: list[int] = []  # their offsets, same order (decode contexts)
        self.offset_max: int | None = None  # the largest offset (the longest context)
        # tick -> bulk requests with an event at that tick
        self.due: dict[int, list[_BulkRequest]] = {}
        self.finishing: list[_BulkRequest] = []  # bulk requests that sample their last token now
        # Rows of this tick's events that get a block: appended in one call before the
        # manager's next other call, so that its calls keep the per-request path's order.
        self.appends: list[str] = []
        self._next_seq = 0
        self.offset_sum = 0
        self.min_span_sum = 0  # sum of min(span, final), paged
        self.over_final_sum = 0  # sum of span - min(span, final), paged
        # With deferred hashes filled blocks join the prefix cache later: no event for a fill
        self.fills = (
            BulkFills.attach(manager, self._fill_outputs, self._block_tokens)
            if self.direct and self.caching
            else None
        )

    @classmethod
    def for_config(
        cls, config: EngineConfig, scheduler: Scheduler, runner: CostModelRunner, records
    ) -> BulkDecodes | None:
        """Bulk decodes for an engine the simulator built from `config` (its scheduler,
        runner and KV probe), or None where it does not apply: a sliding window frees blocks
        on every paged allocation."""
        paged = config.allocator == "paged"
        if paged and config.model_spec.sliding_window is not None:
            return None
        return cls(scheduler, runner, records, paged=paged)

    # ---- one step --------------------------------------------------------------------------
    def begin_step(self, now: float) -> int:
        """At the start of a step: make eligible running requests bulk requests and run their
        events of this tick. Returns how many there are; 0: a per-request step (then no
        bulk request is left)."""
        running = self.scheduler.running
        members = self.members
        n = len(members)
        fills = self.fills
        if fills is not None:
            fills.set_frontier(self.tick, -1)  # nothing of this tick filled yet
        if n and (len(running) < n or running[n - 1] is not members[-1].request):
            raise InternalError("bulk decodes: the running list changed outside a step")
        if len(running) > n and n < self.budget:
            n = self._convert(running, n, now)
        if not n:
            return 0
        if self.priority and n < len(running):
            self.dissolve()
            return 0
        g = self.tick
        due = self.due.pop(g, None)
        if due is not None:
            if len(due) > 1:
                due.sort(key=_by_seq)  # running order (seq numbers are unique)
            if self.paged and len(due) > self.manager.num_free_blocks:
                need = 0
                for member in due:
                    if member.alloc_at == member.offset + g:
                        need += 1
                if need > self.manager.num_free_blocks:  # an allocation could preempt
                    self.dissolve()
                    return 0
            self._run_events(due, g)
        if fills is not None:
            fills.set_frontier(g)
        return n

    def context_sum(self) -> int:
        """Sum of the bulk requests' contexts (num_computed_tokens before this step)."""
        return self.offset_sum + len(self.members) * self.tick

    def contexts(self) -> Sequence[int]:
        """The bulk requests' contexts before this step, in running order (computed on read)."""
        return _Contexts(self.offsets, len(self.offsets), self.tick, self.offset_max)

    def end_step(self, now: float) -> list[Request]:
        """After the step's time has passed: the bulk requests that finished, up to date (last
        token appended, in running order) for `Scheduler.finish_bulk_decodes`."""
        g = self.tick
        done = self.finishing
        finished: list[Request] = []
        if done:
            fills = self.fills
            if fills is not None:  # their filled blocks join before they are freed
                for member in done:
                    if member.root is not None:
                        fills.join_root(member.root)
            for member in done:
                request = member.request
                c = member.offset + g
                request.num_computed_tokens = c + 1
                self._fill_outputs(member, c + 2 - member.prompt_len)
                record = member.record
                record.last_token_time = now
                record.num_output_tokens = member.num_record_tokens0 + g + 1 - member.g0
                member.done = True
                self._forget(member)
                finished.append(request)
            members = self.members
            i = bisect_left(members, done[0].seq, key=_by_seq) if len(done) == 1 else -1
            if i >= 0 and members[i] is done[0]:  # the common case: one finishes
                self.members = members[:i] + members[i + 1 :]
                self.offsets = self.offsets[:i] + self.offsets[i + 1 :]
            else:
                self.members = [member for member in members if not member.done]
                self.offsets = [member.offset for member in self.members]
            self.offset_max = max(self.offsets, default=None)
            self.finishing = []
        self.tick = g + 1
        self.last_tick_time = now
        return finished

    def probe_sums(self) -> tuple[int, int, int, int]:
        """(n, computed sum, min-span sum, over-final sum) after `end_step`, for the probe."""
        n = len(self.members)
        return n, self.offset_sum + n * self.tick, self.min_span_sum, self.over_final_sum

    def dissolve(self) -> None:
        """Bring every bulk request up to date (start of the current tick); none stays one."""
        g = self.tick
        if self.fills is not None:
            self.fills.join_all()
            self.fills.clear()
        for member in self.members:
            request = member.request
            c = member.offset + g
            request.num_computed_tokens = c
            self._fill_outputs(member, c + 1 - member.prompt_len)
            if g > member.g0:
                member.record.last_token_time = self.last_tick_time
                member.record.num_output_tokens = member.num_record_tokens0 + g - member.g0
        self.members = []
        self.offsets = []
        self.offset_max = None
        self.due = {}
        self.finishing = []
        self.offset_sum = self.min_span_sum = self.over_final_sum = 0

    # ---- helpers ---------------------------------------------------------------------------
    def _convert(self, running: list[Request], n: int, now: float) -> int:
        """Make running[n], running[n+1], ... bulk requests while they are eligible: decode shape
        with a token sampled at the end of the previous step (so that their ITL is that step's
        duration), a row, no copy-on-write, nothing overdue. Returns the new count."""
        g = self.tick
        records = self.records
        bs = self.block_size
        paged, caching = self.paged, self.caching
        manager = self.manager
        row_blocks = manager.decode_row_blocks
        if paged:
            cached = manager.num_cached_block
        last_c = self.max_model_len - 2  # a decode past it gets no token (max_model_len cap)
        table = self.table
        fills = self.fills
        in_fills = False
        limit = min(len(running), self.budget)
        members, offsets, due = self.members, self.offsets, self.due
        while n < limit:
            request = running[n]
            c = request.num_computed_tokens
            prompt_len = len(request.prompt_token_ids)
            num_out = len(request.output_token_ids)
            if not num_out or c != prompt_len + num_out - 1 or c > last_c or c < 1:
                break
            rid = request.request_id
            record = records[rid]
            if record.last_token_time != now:
                break
            num_blocks = row_blocks(rid)
            if num_blocks is None:
                break
            span = num_blocks * bs
            if paged:
                in_fills = fills is not None and cached[rid] > 0
                hash_at = (cached[rid] + 1) * bs - 1 if caching and not in_fills else _NEVER
            else:
                hash_at = _NEVER
            if span < c or hash_at < c:
                break
            max_tokens = request.max_tokens
            finish_at = min(prompt_len + max_tokens - 2, last_c)
            if finish_at < c:
                finish_at = c
            member = _BulkRequest(
                request,
                rid,
                record,
                self._next_seq,
                c - g,
                g,
                record.num_output_tokens,
                prompt_len,
                prompt_len + max_tokens - 1,
                span,
                span,
                hash_at,
                finish_at,
                table.start(request) if table is not None else 0,
            )
            self._next_seq += 1
            if in_fills:
                fills.add(member, request.block_hashes[0])  # type: ignore[union-attr]
            members.append(member)
            offsets.append(c - g)
            if self.offset_max is None or c - g > self.offset_max:
                self.offset_max = c - g
            self.offset_sum += c - g
            self._add_span(member.final, span, 1)
            at = min(span, hash_at, finish_at) - c + g
            bucket = due.get(at)
            if bucket is None:
                due[at] = [member]
            else:
                bucket.append(member)
            n += 1
        return n

    def _run_events(self, due: list[_BulkRequest], g: int) -> None:
        """This tick's events, in running order: a block appended or a full block cached
        where the per-request path's allocate_slots would change something, and the finishing
        requests noted for `end_step`.

        The common events go straight to the manager (`append_decode_blocks`,
        `cache_decode_block` with the block's tokens from the synthetic token table), leaving
        it a bulk request; the others (a contiguous row, a block that holds prompt tokens, no
        usable table) bring the request up to date and call the real `allocate_slots`."""
        manager = self.manager
        bs = self.block_size
        buckets = self.due
        direct = self.direct
        if direct:
            cache_decode_block = manager.cache_decode_block
        appends = self.appends
        min_span_delta = over_final_delta = 0  # added to the sums once, after the loop
        finishing = self.finishing
        for member in due:
            offset = member.offset
            c = offset + g
            alloc_at, hash_at = member.alloc_at, member.hash_at
            if c == alloc_at:
                if direct and hash_at != c:  # both at once (block size 1): the general call
                    appends.append(member.rid)
                    final = member.final
                    grown = c + bs  # the span was c
                    fill = c if c < final else final
                    grown_fill = grown if grown < final else final
                    min_span_delta += grown_fill - fill
                    over_final_delta += grown - grown_fill - c + fill
                    member.span = member.alloc_at = alloc_at = grown
                else:
                    self._allocate(member, c)
                    alloc_at, hash_at = member.alloc_at, member.hash_at
            elif c == hash_at:
                # the block's tokens packed (not block 0: it is the root, hashed at once)
                packed = self._block_tokens(member, c // bs) if direct and c + 1 >= 2 * bs else None
                if packed is not None:
                    if appends:
                        self._append_blocks()
                    cache_decode_block(member.request, packed)
                    member.hash_at = hash_at = c + bs
                else:  # the general call (a prompt token out of int32 says so there)
                    self._allocate(member, c)
                    alloc_at, hash_at = member.alloc_at, member.hash_at
            at = member.finish_at
            if at == c:
                finishing.append(member)
                continue
            if hash_at < at:
                at = hash_at
            if alloc_at < at:
                at = alloc_at
            at -= offset
            if at <= g:
                raise InternalError(f"bulk decodes: {member.rid!r} has an event left in this step")
            bucket = buckets.get(at)
            if bucket is None:
                buckets[at] = [member]
            else:
                bucket.append(member)
        if appends:
            self._append_blocks()
        self.min_span_sum += min_span_delta
        self.over_final_sum += over_final_delta

    def _append_blocks(self) -> None:
        """The blocks of `appends`, before any other call to the manager."""
        appends = self.appends
        if not self.manager.append_decode_blocks(appends):
            raise InternalError(
                f"bulk decodes: no blocks for {len(appends)} rows with their blocks free"
            )
        appends.clear()

    def _allocate(self, member: _BulkRequest, c: int) -> None:
        """An event through the real `allocate_slots`, the request brought up to date first."""
        if self.appends:
            self._append_blocks()
        manager = self.manager
        bs = self.block_size
        request = member.request
        rid = request.request_id
        fills = self.fills
        if fills is not None:  # the bulk requests ahead of it have filled this tick's blocks
            fills.set_frontier(c - member.offset, member.seq)
        request.num_computed_tokens = c
        self._fill_outputs(member, c + 1 - member.prompt_len)
        if manager.allocate_slots(request, 1) is None:
            raise InternalError(
                f"bulk decodes: allocate_slots failed for {rid!r} with its blocks free"
            )
        if member.alloc_at == c:
            span = manager.decode_row_blocks(rid) * bs
            self._add_span(member.final, member.span, -1)
            self._add_span(member.final, span, 1)
            member.span = member.alloc_at = span
        if self.caching:
            member.hash_at = (manager.num_cached_block[rid] + 1) * bs - 1
            if fills is not None and member.root is None and manager.num_cached_block[rid] > 0:
                member.hash_at = _NEVER  # its first block is cached: the others join later
                fills.add(member, request.block_hashes[0])
        if member.alloc_at <= c or member.hash_at <= c:
            raise InternalError(
                f"bulk decodes: {rid!r} still has an allocation due after allocate_slots"
            )

    def _add_span(self, final: int, span: int, sign: int) -> None:
        fill_to = span if span < final else final
        self.min_span_sum += sign * fill_to
        self.over_final_sum += sign * (span - fill_to)

    def _forget(self, member: _BulkRequest) -> None:
        if self.fills is not None:
            self.fills.remove(member)
        self.offset_sum -= member.offset
        self._add_span(member.final, member.span, -1)

    def _block_tokens(self, member: _BulkRequest, index: int) -> bytes | None:
        """Block `index` (>= 1) of a bulk request as the int32 bytes its hash reads, from the
        synthetic token table (its output tokens may not be appended yet); None if a prompt
        token does not fit in int32."""
        bs = self.block_size
        first = index * bs - member.prompt_len  # output index of the block's first token
        table = self.table
        if table is None:
            raise InternalError("block tokens asked with no token table")
        if first >= 0:  # output tokens only: one slice
            k = 4 * ((member.tok0 + first) % self.vocab_size)
            return table.packed_table[k : k + 4 * bs]
        packed = _pack_tokens(member.request.prompt_token_ids[first:])  # the prompt's last tokens
        outputs = table.packed(member.tok0, 0, bs + first)
        return None if packed is None or outputs is None else packed + outputs

    def _fill_outputs(self, member: _BulkRequest, count: int) -> None:
        """Append the synthetic output tokens the runner would have sampled, up to `count`."""
        out = member.request.output_token_ids
        have = len(out)
        if have < count:
            if self.table is not None:
                out += self.table.tokens(member.tok0, have, count)
            else:
                out += synthetic_tokens(member.request, have, count, self.vocab_size)


class _Contexts(Sequence):
    """Decode contexts `offset + tick` of the first `n` bulk requests, computed when read.

    `offsets` is `BulkDecodes.offsets`: it only ever grows at its end (new bulk requests) or is
    replaced by a new list (finished ones removed), so its first `n` items never change and
    the view needs no copy; `offset_max` (optional) is their largest, kept by `BulkDecodes`.
    """

    __slots__ = ("_offsets", "_n", "_tick", "_max")

    def __init__(
        self, offsets: list[int], n: int, tick: int, offset_max: int | None = None
    ) -> None:
        self._offsets, self._n, self._tick, self._max = offsets, n, tick, offset_max

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        values = [o + self._tick for o in self._offsets[: self._n]]
        return values[i]

    def __iter__(self):
        return map(self._tick.__add__, self._offsets[: self._n])  # int + int, in C

    def longest(self) -> int:
        """The longest context (0 for none), without building the values
        (`pagesim.cost.base.longest_context` asks for it)."""
        n, offsets = self._n, self._offsets
        if not n:
            return 0
        if self._max is None:
            self._max = max(offsets) if n == len(offsets) else max(offsets[:n])
        return self._max + self._tick
