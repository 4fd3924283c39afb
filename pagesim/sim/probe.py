"""The per-step KV probe: usage and the four-way waste split, time-weighted into an averager.

The engine calls the probe once per step, after the step's update. The split of that moment
lasts until the next probe, so each snapshot is weighted by the time to the next one (an idle
gap included).

Two ways to take a snapshot, with identical results:

    probe()                        reads every running request (O(running))
    probe.with_bulk_sums(n, ...)   the first n running requests are summarised by the caller
                                   (bulk decodes keep their sums up to date); only
                                   the other running requests are read
"""

from __future__ import annotations

import simpy

from pagesim.kvcache.waste import (
    KVProbe,
    KVWaste,
    ProbeValues,
    WasteAverager,
    contiguous_slots,
    kv_waste,
    paged_tails,
    paged_waste_from_tails,
)


class WasteProbe(KVProbe):
    """The simulator's `KVProbe`: snapshots of one replica's KV memory, fed to `averager`
    (see the module docstring)."""

    def __init__(self, scheduler, manager, averager: WasteAverager, env: simpy.Environment) -> None:
        self.scheduler = scheduler
        self.manager = manager
        self.averager = averager
        self.env = env
        self.contiguous: bool = manager.is_contiguous
        self._last_time = 0.0
        self._last: KVWaste | None = None

    def __call__(self) -> ProbeValues:
        scheduler = self.scheduler
        waiting = scheduler.waiting
        head = waiting.peek_request() if (self.contiguous and waiting) else None
        return self._record(kv_waste(self.manager, scheduler.running, head))

    def with_bulk_sums(
        self, num_bulk: int, computed_sum: int, min_span_sum: int, over_final_sum: int
    ) -> ProbeValues:
        """The snapshot, with the first `num_bulk` running requests given as sums (tokens):
        `computed_sum` of their `num_computed_tokens`; paged only, over their rows,
        `min_span_sum` of min(row span, final K/V length) and `over_final_sum` of the span past
        the final length. Each such request must have computed fewer tokens than its final
        length (true of any unfinished decoding request)."""
        scheduler = self.scheduler
        manager = self.manager
        running = scheduler.running
        if self.contiguous:
            waiting = scheduler.waiting
            head = waiting.peek_request() if waiting else None
            tokens = computed_sum
            for request in running[num_bulk:]:
                tokens += request.num_computed_tokens
            return self._record(contiguous_slots(manager, head, tokens).fractions())
        if len(running) > num_bulk:
            reserved, internal = paged_tails(manager, running[num_bulk:])
        else:  # the common step: every running request is summarised
            reserved = internal = 0
        return self._record(
            paged_waste_from_tails(
                manager, reserved + min_span_sum - computed_sum, internal + over_final_sum
            )
        )

    def _record(self, w: KVWaste) -> ProbeValues:
        now = self.env.now
        if self._last is not None:
            self.averager.add(self._last, now - self._last_time)
        self._last_time, self._last = now, w
        return (
            self.manager.usage,
            w.token_states,
            w.reserved,
            w.internal_fragmentation,
            w.external_fragmentation,
        )
