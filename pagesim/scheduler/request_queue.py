"""Waiting queues, as vLLM v1's `request_queue.py`: first-come-first-served and priority.

The scheduler only peeks, pops, adds and prepends, so both queues share one small interface.
`prepend_request` is how a preempted request goes back to the *front* (FCFS); a priority queue
has no front, so there it is an ordinary `add_request` (vLLM does the same).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from pagesim.errors import ConfigError
from pagesim.request import Request


class FCFSRequestQueue(deque[Request]):
    """Arrival order; preempted requests re-enter at the head (`prepend_request`)."""

    def add_request(self, request: Request) -> None:
        self.append(request)

    def pop_request(self) -> Request:
        return self.popleft()

    def peek_request(self) -> Request:
        if not self:
            raise IndexError("peek from an empty queue")
        return self[0]

    def prepend_request(self, request: Request) -> None:
        self.appendleft(request)

    def remove_request(self, request: Request) -> None:
        self.remove(request)

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        kept = [r for r in self if id(r) not in drop]
        self.clear()
        self.extend(kept)


class PriorityRequestQueue:
    """Smallest `(priority, arrival_time)` first, as vLLM's `Request.__lt__` orders them.

    vLLM breaks the remaining ties by `request_id`; a final insertion counter keeps the heap
    from ever comparing two `Request` objects (they define no order) and makes equal requests
    leave in insertion order.
    """

    def __init__(self) -> None:
        # (priority, arrival_time, request_id, insertion counter, request)
        self._heap: list[tuple[int, float, str, int, Request]] = []
        self._counter = 0

    def add_request(self, request: Request) -> None:
        self._counter += 1
        heapq.heappush(
            self._heap,
            (request.priority, request.arrival_time, request.request_id, self._counter, request),
        )

    def pop_request(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[-1]

    def peek_request(self) -> Request:
        if not self._heap:
            raise IndexError("peek from an empty queue")
        return self._heap[0][-1]

    def prepend_request(self, request: Request) -> None:
        """No front in a priority queue: the request takes its place by priority."""
        self.add_request(request)

    def remove_request(self, request: Request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable[Request]) -> None:
        drop = {id(r) for r in requests}
        self._heap = [e for e in self._heap if id(e[-1]) not in drop]
        heapq.heapify(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in sorted(self._heap))


def create_request_queue(policy: str) -> FCFSRequestQueue | PriorityRequestQueue:
    """The queue for a `scheduling_policy` name (`fcfs` or `priority`)."""
    if policy == "fcfs":
        return FCFSRequestQueue()
    if policy == "priority":
        return PriorityRequestQueue()
    raise ConfigError(f"scheduling_policy={policy!r}: choose one of fcfs, priority")
