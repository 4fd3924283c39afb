"""Prefix-cache counters, in tokens, as vLLM reports them (`vllm:prefix_cache_queries`,
`vllm:prefix_cache_hits`; hit rate = hits / queries).

A request is counted once per admission: when its first `allocate_slots` succeeds, its
`num_tokens` are queries and its prefix hit is hits. Lookups of a request that is not admitted
(allocation failed, stays waiting) are not counted, as in vLLM >= 0.2x. Re-admissions after a
preemption go to the `preempted_*` counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.request import Request


@dataclass(slots=True)
class PrefixCacheStats:
    requests: int = 0  # admissions of requests never preempted
    queries: int = 0  # tokens looked up by those admissions
    hits: int = 0  # tokens found in the cache
    preempted_requests: int = 0  # re-admissions after a preemption
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False  # the prefix cache was reset in this interval

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits

    @property
    def hit_rate(self) -> float:
        """hits / queries over first admissions (0.0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0


class PrefixStatsCounters:
    """Mixin of every KV cache manager: the counters since construction (or reset),
    `prefix_cache_stats`, and since the last `make_prefix_cache_stats()`, `_interval_stats`,
    which the manager sets to fresh `PrefixCacheStats()`."""

    prefix_cache_stats: PrefixCacheStats
    _interval_stats: PrefixCacheStats

    def _record_admission(self, request: Request, num_hit_tokens: int) -> None:
        """Count the request's admission, with `num_hit_tokens` found in the cache, in both."""
        preempted = request.num_preemptions > 0
        self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, preempted)
        self._interval_stats.record(request.num_tokens, num_hit_tokens, preempted)

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Prefix-cache stats since the previous call (vLLM's interval stats), then reset."""
        stats, self._interval_stats = self._interval_stats, PrefixCacheStats()
        return stats
