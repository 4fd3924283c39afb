"""Preemption: which running request gives way, and what happens to its K/V.

Victim (vLLM v1 `Scheduler.schedule`): under `fcfs` the last request of the running list (the
most recently admitted), under `priority` `max(running, key=(priority, arrival_time))`. On
exactly equal keys vLLM's `max` takes the first in running order; a served vLLM never meets
such a tie, since its arrival times are wall-clock reads that grow with arrival order, but a
simulation does (every request of a rate-inf load arrives at t=0), and there the literal rule
can cycle forever: two tied requests that cannot both fit each preempt the other when it is
one step from done. So ties go to arrival order (`Request.arrival_rank`) unless `literal`: the
latest arrival gives way, as it would in a served vLLM. The parity harness, which feeds vLLM
and pagesim the same tied times, asks for the literal rule.

Modes:

- `recompute` (vLLM v1, the only mode vLLM v1 has): free the victim's blocks, status
  `PREEMPTED`, `num_computed_tokens = 0`, put it at the head of the waiting queue. Its freed
  blocks stay in the prefix cache until evicted, so on readmission it often hits them.
- `swap` (legacy vLLM V0 model; vLLM removed `--swap-space` in 0.18): copy the victim's
  written blocks to a CPU pool of `swap_space` GiB, free them on the GPU, status `SWAPPED`,
  keep `num_computed_tokens`. Before it runs again it is swapped back in (new GPU blocks, the
  same content). If the CPU pool cannot hold it, that victim is recomputed instead.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pagesim.errors import ConfigError, InternalError
from pagesim.request import Request, RequestStatus
from pagesim.scheduler.output import SchedulerOutput
from pagesim.specs import GiB


def _literal_key(r: Request) -> tuple:
    return r.priority, r.arrival_time


def _ranked_key(r: Request) -> tuple:
    return r.priority, r.arrival_time, r.arrival_rank


def select_victim_index(running: list[Request], policy: str, literal: bool = False) -> int:
    """Index in `running` of the request to preempt (`running` is not empty). `priority` ties
    go to the later arrival (`arrival_rank`), or with `literal` to the first of the tied in
    running order, as vLLM's `max` does."""
    if policy == "priority":
        key = _literal_key if literal else _ranked_key
        best = 0
        best_key = key(running[0])
        for i in range(1, len(running)):
            k = key(running[i])
            if k > best_key:  # strictly greater: the first maximum wins, as in max()
                best, best_key = i, k
        return best
    return len(running) - 1


class CPUSwapPool:
    """CPU blocks that hold swapped-out K/V (swap preemption only).

    Capacity in blocks is `swap_space bytes // page_size_bytes`, where a page is one KV block
    across all layers (K and V). Block ids are handed out lowest first and reused lowest first,
    so runs are reproducible.
    """

    def __init__(self, num_blocks: int, page_size_bytes: int) -> None:
        if num_blocks < 0:
            raise ConfigError(f"num_blocks={num_blocks}: must be >= 0")
        if page_size_bytes < 1:
            raise ConfigError(f"page_size_bytes={page_size_bytes}: must be >= 1")
        self.num_blocks = num_blocks
        self.page_size_bytes = page_size_bytes  # bytes of one block, all layers, K and V
        self._free: deque[int] = deque(range(num_blocks))

    @classmethod
    def from_swap_space(cls, swap_space_gib: float, page_size_bytes: int) -> CPUSwapPool:
        """A pool of `swap_space_gib` GiB (vLLM's `--swap-space`, per GPU)."""
        if page_size_bytes < 1:
            raise ConfigError(f"page_size_bytes={page_size_bytes}: must be >= 1")
        return cls(int(swap_space_gib * GiB) // page_size_bytes, page_size_bytes)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of CPU blocks holding swapped-out K/V."""
        return 1.0 - len(self._free) / self.num_blocks if self.num_blocks else 0.0

    def allocate(self, n: int) -> list[int] | None:
        """`n` CPU block ids, or None (nothing taken) if fewer are free."""
        if n > len(self._free):
            return None
        free = self._free
        return [free.popleft() for _ in range(n)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)
        if len(self._free) > self.num_blocks:
            raise InternalError("CPU swap pool: a block was freed twice")


@dataclass(slots=True)
class SchedulerStats:
    """Counters over a scheduler's life. Tokens unless named; bytes over the host link."""

    num_added: int = 0  # add_request calls
    num_rejected: int = 0  # FINISHED_REJECTED: refused at add_request, or aborted
    num_aborted: int = 0  # of num_rejected: aborted by finish_requests
    num_finished: int = 0  # FINISHED_LENGTH
    num_preemptions: int = 0  # victims, both modes
    num_swap_preemptions: int = 0  # victims swapped out to the CPU pool
    num_swap_fallbacks: int = 0  # swap victims recomputed because the CPU pool was full
    preempted_computed_tokens: int = 0  # K/V tokens dropped by recompute preemptions
    recomputed_tokens: int = 0  # of those, tokens not found in the prefix cache on readmission
    num_prefix_query_tokens: int = 0  # tokens looked up in the prefix cache at admissions
    num_prefix_hit_tokens: int = 0  # of those, tokens found (not computed)
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    swapped_out_bytes: int = 0
    swapped_in_bytes: int = 0


class Preemptor:
    """Carries out a preemption in the configured mode and keeps the swap bookkeeping."""

    def __init__(
        self,
        kv_cache_manager,
        mode: str,
        block_size: int,
        swap_pool: CPUSwapPool | None,
        stats: SchedulerStats,
    ) -> None:
        if mode == "swap" and swap_pool is None:
            raise ConfigError("preemption_mode='swap': needs a CPU swap pool")
        self.kv = kv_cache_manager
        self.swap = mode == "swap"
        self.block_size = block_size
        self.swap_pool = swap_pool
        self.stats = stats
        self._cpu_blocks: dict[str, list[int]] = {}  # swapped request id -> its CPU blocks
        self._dropped: dict[str, int] = {}  # recomputed request id -> tokens it had computed

    def preempt(self, request: Request, waiting, swapped, out: SchedulerOutput) -> None:
        """Preempt `request`, already taken out of the running list.

        Swapped victims go to the head of `swapped`, recomputed ones to the head of `waiting`.
        """
        self.stats.num_preemptions += 1
        request.num_preemptions += 1
        out.preempted_req_ids.append(request.request_id)
        if self.swap and self._swap_out(request, out):
            swapped.prepend_request(request)
            return
        self.kv.free(request)
        self.stats.preempted_computed_tokens += request.num_computed_tokens
        self._dropped[request.request_id] = request.num_computed_tokens
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        waiting.prepend_request(request)

    def _swap_out(self, request: Request, out: SchedulerOutput) -> bool:
        """Copy the blocks holding written K/V to the CPU pool; False if it has no room."""
        pool = self.swap_pool
        assert pool is not None  # only called with a swap pool
        n = -(-request.num_computed_tokens // self.block_size)  # blocks with written K/V
        cpu_ids = pool.allocate(n)
        if cpu_ids is None:
            self.stats.num_swap_fallbacks += 1
            return False
        gpu_ids = self.kv.get_block_ids(request.request_id)[:n]
        out.blocks_to_swap_out.extend(zip(gpu_ids, cpu_ids, strict=True))
        nbytes = n * pool.page_size_bytes
        out.swap_bytes += nbytes
        self.stats.num_swap_preemptions += 1
        self.stats.swapped_out_blocks += n
        self.stats.swapped_out_bytes += nbytes
        self._cpu_blocks[request.request_id] = cpu_ids
        self.kv.free(request)
        request.status = RequestStatus.SWAPPED
        return True

    def swap_in(self, request: Request, gpu_block_ids: list[int], out: SchedulerOutput) -> None:
        """Record the copy of a swapped request's CPU blocks into its new GPU blocks."""
        pool = self.swap_pool
        assert pool is not None  # only swapped requests come here
        cpu_ids = self._cpu_blocks.pop(request.request_id)
        n = len(cpu_ids)
        out.blocks_to_swap_in.extend(zip(cpu_ids, gpu_block_ids[:n], strict=True))
        nbytes = n * pool.page_size_bytes
        out.swap_bytes += nbytes
        self.stats.swapped_in_blocks += n
        self.stats.swapped_in_bytes += nbytes
        pool.free(cpu_ids)

    def on_readmit(self, request: Request, num_hit_tokens: int) -> None:
        """A recomputed request is admitted again with `num_hit_tokens` found in the cache."""
        lost = self._dropped.pop(request.request_id, 0)
        if lost > num_hit_tokens:
            self.stats.recomputed_tokens += lost - num_hit_tokens

    def drop(self, request: Request) -> None:
        """Forget an aborted request: give back its CPU blocks if it was swapped out."""
        self._dropped.pop(request.request_id, None)
        cpu_ids = self._cpu_blocks.pop(request.request_id, None)
        if cpu_ids is not None and self.swap_pool is not None:
            self.swap_pool.free(cpu_ids)
