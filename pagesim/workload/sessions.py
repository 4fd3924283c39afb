"""Multi-turn session structure, and the cursor a simulated user walks a session with.

A plan's requests are grouped into sessions (`session_offsets`, CSR); a single-turn request
is a session of one turn. Turn k+1 of a session is sent only after turn k finished plus a
think time (closed loop), and its prompt extends turn k's:

    prompt[k+1] = prompt[k] + answer[k] + new user tokens[k+1]

The answer tokens are the ones the runner actually emitted (`Request.output_token_ids`), so
the workload never needs to know how outputs are made; the whole of turn k's prompt and
answer is then a prefix of turn k+1's prompt and hits the prefix cache if still resident.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from pagesim.errors import WorkloadError
from pagesim.request import Request

if TYPE_CHECKING:
    from pagesim.workload.plan import RequestPlan


def assign_sessions(
    user_lens: np.ndarray,
    output_lens: np.ndarray,
    session_prefix: np.ndarray,
    turns: np.ndarray,
    max_context_tokens: int | None,
) -> tuple[np.ndarray, np.ndarray]:
    """Cut requests 0..n-1, in order, into sessions; return (session_offsets, prompt_lens).

    user_lens, output_lens: int64 [n], the new tokens and the answer of each request.
    session_prefix, turns: int64 [n], per *potential* session s (at most n sessions): its
    shared prefix length and its target number of turns. A session ends after `turns[s]`
    requests, or before a turn whose prompt + output would exceed `max_context_tokens` (that
    request then opens the next session). prompt_lens counts the full prompt, history included,
    assuming every earlier turn produced its full output.
    """
    user, out = user_lens.tolist(), output_lens.tolist()
    pre, target = session_prefix.tolist(), turns.tolist()
    cap = max_context_tokens
    n = len(user)
    offsets = [0]
    prompt = [0] * n
    s = turn = 0
    carried = 0  # prompt + output of the previous turn in this session
    for i in range(n):
        p = carried + user[i]
        if turn > 0 and (turn >= target[s] or (cap is not None and p + out[i] > cap)):
            offsets.append(i)
            s += 1
            turn = 0
        if turn == 0:
            p = pre[s] + user[i]
        prompt[i] = p
        carried = p + out[i]
        turn += 1
    offsets.append(n)
    return np.asarray(offsets, dtype=np.int64), np.asarray(prompt, dtype=np.int64)


class Session:
    """A cursor over one session of a plan, for the simulated user that sends it.

    Usage (one SimPy process per session):

        sess = plan.session(s)
        req = sess.first_request(arrival_time=env.now)
        ...wait until req finishes...
        while sess.has_next():
            yield env.timeout(sess.next_think_time_s())
            req = sess.next_request(req, arrival_time=env.now)
    """

    __slots__ = ("plan", "index", "_next", "_stop")

    def __init__(self, plan: RequestPlan, index: int) -> None:
        if not 0 <= index < plan.num_sessions:
            raise WorkloadError(f"session = {index}: plan has {plan.num_sessions} sessions")
        self.plan = plan
        self.index = index
        self._next = int(plan.session_offsets[index])  # plan index of the next request to send
        self._stop = int(plan.session_offsets[index + 1])  # one past its last request

    @property
    def request_indices(self) -> range:
        """Plan indices of this session's turns, in order."""
        return range(int(self.plan.session_offsets[self.index]), self._stop)

    def has_next(self) -> bool:
        return self._next < self._stop

    def first_request(self, arrival_time: float) -> Request:
        """Turn 0 (the session's arrival event)."""
        first = self.request_indices.start
        if self._next != first:
            raise WorkloadError(f"session {self.index}: first request already sent")
        self._next += 1
        return self.plan.make_request(first, arrival_time)

    def next_think_time_s(self) -> float:
        """Seconds the user waits after the previous turn finished before sending the next."""
        self._check_next()
        return float(self.plan.think_time_s[self._next])

    def next_prompt(self, prev_request: Request) -> list[int]:
        """The next turn's prompt: prev prompt + prev answer (as emitted) + new user tokens."""
        self._check_next()
        return (
            prev_request.prompt_token_ids
            + prev_request.output_token_ids
            + self.plan.user_token_ids(self._next)
        )

    def next_request(self, prev_request: Request, arrival_time: float) -> Request:
        """The next turn as a `Request`, built from the finished previous turn."""
        prompt = self.next_prompt(prev_request)
        i = self._next
        self._next += 1
        return self.plan.make_request(i, arrival_time, prompt_token_ids=prompt)

    def _check_next(self) -> None:
        if self._next == self.request_indices.start:
            raise WorkloadError(f"session {self.index}: send first_request() first")
        if not self.has_next():
            raise WorkloadError(f"session {self.index}: no turns left")


class ClosedLoopSessions:
    """The users of a plan's sessions, for a serving loop that keeps its own clock (the GPU
    replay, `pagesim.gpu.serve`): the same closed loop as the simulator's SimPy clients
    (`pagesim.sim.simulate`), through the same `Session` cursor.

    Each session's first turn is due at its arrival time; a later turn is due when the
    previous one finished (or was rejected) plus its think time, and is built then from the
    tokens the previous one emitted. Due turns come out in time order, ties in the order they
    were made due (first turns in session order), as SimPy orders equal-time events.

        clients = ClosedLoopSessions(plan, arrivals)
        for req in clients.due(now): engine.add_request(req)       # each loop iteration
        clients.on_finish(req, now)                                 # each finished request
        clients.next_time()                                         # when idle: sleep until
    """

    def __init__(self, plan: RequestPlan, arrivals: np.ndarray) -> None:
        if len(arrivals) < plan.num_sessions:
            raise WorkloadError(f"arrivals: {len(arrivals)} times for {plan.num_sessions} sessions")
        self.num_sessions = plan.num_sessions
        self._heap: list[tuple[float, int, Request]] = []
        self._order = 0  # tie-break: the order turns were made due
        self._waiting: dict[str, Session] = {}  # in-flight request id -> its session's cursor
        for s in range(plan.num_sessions):
            self._push(plan.session(s), float(arrivals[s]), None)

    def _push(self, session: Session, arrival_time: float, prev: Request | None) -> None:
        req = (
            session.first_request(arrival_time)
            if prev is None
            else session.next_request(prev, arrival_time)
        )
        if session.has_next():
            self._waiting[req.request_id] = session
        heapq.heappush(self._heap, (arrival_time, self._order, req))
        self._order += 1

    def next_time(self) -> float | None:
        """When the next turn is due (None: none is, until a request in flight finishes)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[Request]:
        """The turns due by `now`, in order, taken out."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            out.append(heapq.heappop(heap)[2])
        return out

    def on_finish(self, request: Request, now: float) -> None:
        """`request` ended at `now`: its session's next turn becomes due after the think time."""
        session = self._waiting.pop(request.request_id, None)
        if session is not None:
            self._push(session, now + session.next_think_time_s(), request)

    def unsent(self) -> list[Request]:
        """The turns made but not yet due, in order (a run cut short records them as failed;
        turns after a request still in flight are never made)."""
        return [entry[2] for entry in sorted(self._heap)]

    @property
    def done(self) -> bool:
        """No turn due and none to come."""
        return not self._heap and not self._waiting
