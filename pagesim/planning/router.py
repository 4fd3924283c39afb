"""Request routers for several replicas (`pagesim.sim.cluster.simulate_cluster` runs them).

A router is called once per request at its arrival (`choose(request, engines) -> index`) and
sees the replicas' live state. Three policies, as deployed in front of vLLM fleets:

- `round-robin`: replica k mod N for the k-th request; blind to load and to prefixes.
- `least-loaded`: the replica with the fewest unfinished requests (running + waiting, vLLM's
  `get_request_counts`), ties to the lower KV usage, then the lower index.
- `prefix-aware`: the replica whose prefix cache holds the most of the request's leading
  full blocks (the same lookup as vLLM's `get_computed_blocks`, which touches nothing), ties
  to the least loaded. As SGLang's cache-aware router does, it falls back to the least
  loaded replica when the unfinished-request counts differ by more than
  `balance_abs_threshold`, so that one popular prefix cannot pile all traffic on a replica.

Routers are stateful (the round-robin counter): make a fresh one per run (`make_router`).
Every tie is broken by index, so a run is deterministic.
"""

from __future__ import annotations

from pagesim.errors import unknown_name
from pagesim.request import Request
from pagesim.sim.engine import ServingEngine

ROUTERS: tuple[str, ...] = ("round-robin", "least-loaded", "prefix-aware")


def _load(engine: ServingEngine) -> int:
    running, waiting = engine.scheduler.get_request_counts()
    return running + waiting


def _least_loaded(engines: list[ServingEngine], candidates: list[int]) -> int:
    return min(
        candidates,
        key=lambda i: (_load(engines[i]), engines[i].scheduler.kv_cache_manager.usage, i),
    )


class RoundRobinRouter:
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, request: Request, engines: list[ServingEngine]) -> int:
        i = self._next % len(engines)
        self._next += 1
        return i


class LeastLoadedRouter:
    name = "least-loaded"

    def choose(self, request: Request, engines: list[ServingEngine]) -> int:
        return _least_loaded(engines, list(range(len(engines))))


class PrefixAwareRouter:
    name = "prefix-aware"

    def __init__(self, balance_abs_threshold: int = 32) -> None:
        self.balance_abs_threshold = balance_abs_threshold

    def choose(self, request: Request, engines: list[ServingEngine]) -> int:
        everyone = list(range(len(engines)))
        loads = [_load(e) for e in engines]
        if max(loads) - min(loads) > self.balance_abs_threshold:
            return _least_loaded(engines, everyone)
        hits = [prefix_hit_blocks(e, request) for e in engines]
        best = max(hits)
        return _least_loaded(engines, [i for i in everyone if hits[i] == best])


def prefix_hit_blocks(engine: ServingEngine, request: Request) -> int:
    """Leading full blocks of `request` cached on `engine` (free-but-cached blocks count)."""
    manager = engine.scheduler.kv_cache_manager
    blocks, _ = manager.get_computed_blocks(request)
    return len(blocks)


def make_router(name: str, **kwargs) -> RoundRobinRouter | LeastLoadedRouter | PrefixAwareRouter:
    """A fresh router by name (`ROUTERS`); kwargs go to its constructor."""
    if name == "round-robin":
        return RoundRobinRouter(**kwargs)
    if name == "least-loaded":
        return LeastLoadedRouter(**kwargs)
    if name == "prefix-aware":
        return PrefixAwareRouter(**kwargs)
    raise unknown_name("router", name, ROUTERS)
