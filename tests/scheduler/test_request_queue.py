"""FCFS and priority waiting queues (vLLM's request_queue.py semantics)."""

from __future__ import annotations

import pytest
from sched_helpers import req

from pagesim.errors import ConfigError
from pagesim.scheduler.request_queue import (
    FCFSRequestQueue,
    PriorityRequestQueue,
    create_request_queue,
)


def ids(queue) -> list[str]:
    return [r.request_id for r in queue]


def test_fcfs_order_prepend_and_remove() -> None:
    q = FCFSRequestQueue()
    a, b, c, d = (req(x, 4) for x in "abcd")
    for r in (a, b, c):
        q.add_request(r)
    assert q.peek_request() is a and len(q) == 3
    q.prepend_request(d)  # a preempted request goes back to the head
    assert ids(q) == ["d", "a", "b", "c"]
    assert q.pop_request() is d
    q.remove_request(b)
    assert ids(q) == ["a", "c"]
    q.prepend_request(b)
    q.prepend_request(d)
    assert ids(q) == ["d", "b", "a", "c"]
    q.remove_requests([d, c])
    assert ids(q) == ["b", "a"]


def test_priority_orders_by_priority_then_arrival_then_id() -> None:
    q = PriorityRequestQueue()
    q.add_request(req("late-urgent", 4, priority=0, arrival_time=5.0))
    q.add_request(req("low", 4, priority=3, arrival_time=0.0))
    q.add_request(req("early-urgent", 4, priority=0, arrival_time=1.0))
    q.add_request(req("tie-b", 4, priority=1, arrival_time=2.0))
    q.add_request(req("tie-a", 4, priority=1, arrival_time=2.0))
    assert ids(q) == ["early-urgent", "late-urgent", "tie-a", "tie-b", "low"]
    assert q.peek_request().request_id == "early-urgent"
    # prepend has no front in a priority queue: the request takes its place by priority
    q.prepend_request(req("back", 4, priority=2, arrival_time=0.0))
    assert ids(q) == ["early-urgent", "late-urgent", "tie-a", "tie-b", "back", "low"]
    popped = [q.pop_request().request_id for _ in range(2)]
    assert popped == ["early-urgent", "late-urgent"]
    q.remove_request(next(r for r in q if r.request_id == "tie-b"))
    assert ids(q) == ["tie-a", "back", "low"] and len(q) == 3 and q


def test_empty_queues_raise_and_unknown_policy() -> None:
    for q in (FCFSRequestQueue(), PriorityRequestQueue()):
        assert not q
        with pytest.raises(IndexError):
            q.peek_request()
        with pytest.raises(IndexError):
            q.pop_request()
    assert isinstance(create_request_queue("fcfs"), FCFSRequestQueue)
    assert isinstance(create_request_queue("priority"), PriorityRequestQueue)
    with pytest.raises(ConfigError, match="scheduling_policy='sjf'"):
        create_request_queue("sjf")
