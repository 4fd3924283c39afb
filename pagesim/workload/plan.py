"""`RequestPlan`: every request of a run as columns, with prompts made on demand.

A plan is what `Workload.sample` returns: lengths, sessions, sharing keys, salts and the
workload's own arrival process for `num_prompts` requests, in numpy arrays (100k requests
take a few MB). Prompt token ids are materialized one request at a time, when the simulator
admits it, from the content key, the request's roots and its lengths (see `tokens`).

Index i is the request's position in dispatch order: sessions are contiguous and in arrival
order (session s holds requests session_offsets[s] .. session_offsets[s+1]-1, turn by turn).
Turn 0 of a session is its arrival event; later turns follow in closed loop (`Session`).

Turn-0 prompt layout (any part may be empty):

    | shared prefix (prefix_root) | hash blocks (block_roots, 512 each, last partial) | own tokens (user_root) |
      prefix_lens[i]                prompt - prefix - user                              user_lens[i]

A later turn is the previous prompt + the previous answer + `user_lens[i]` own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from pagesim.errors import WorkloadError
from pagesim.request import Request
from pagesim.workload.sessions import Session
from pagesim.workload.spec import ArrivalSpec
from pagesim.workload.tokens import block_segments, segment_token_list


@dataclass(frozen=True, eq=False)
class RequestColumns:
    """The per-request columns of a plan, as the workload builder assembles them part by part
    (a mix concatenates its components' columns, shifting their roots and tenants)."""

    # ---- per request, int64 [num_requests] unless noted ----
    prompt_lens: np.ndarray  # tokens of the full prompt (history included for later turns)
    output_lens: np.ndarray  # tokens to generate (= Request.max_tokens)
    prefix_lens: np.ndarray  # shared system-prompt tokens the prompt starts with (0: none)
    prefix_roots: np.ndarray  # content root of that prefix
    user_lens: np.ndarray  # the request's own new tokens (at the end of its prompt)
    user_roots: np.ndarray  # content root of those tokens (unique per request)
    block_offsets: np.ndarray  # int64 [num_requests + 1]: CSR into block_roots
    block_roots: np.ndarray  # int64 [total blocks]: Mooncake hash blocks (roots) of turn 0
    tenants: np.ndarray  # index into tenant_salts
    tenant_salts: tuple[str | None, ...]  # cache_salt per tenant (None: no salt)
    turns: np.ndarray  # turn within its session (0: the session's first request)
    think_time_s: np.ndarray  # float64: pause after the previous turn finished (0 on turn 0)
    session_offsets: np.ndarray  # int64 [num_sessions + 1]: CSR of sessions over requests
    trace_times_s: np.ndarray | None  # float64 [num_sessions]: trace timestamps, if any
    num_roots: int  # distinct content roots in the plan (< vocab_size**2)


@dataclass(frozen=True, eq=False)
class RequestPlan(RequestColumns):
    """A deterministic request plan: same (workload, num_prompts, seed, vocab) -> same bytes."""

    name: str
    seed: int
    vocab_size: int
    content_key: int  # 64-bit key placing each root's window in token_table (from the seed)
    token_table: np.ndarray  # int64 [2 * TABLE_SIZE]: seeded uniform tokens (see tokens.py)
    sessions: np.ndarray  # int64 [num_requests]: session of each request
    arrival: ArrivalSpec  # the workload's own arrival process for session starts
    n: int = 1  # samples per prompt (parallel sampling); every request is sent n times

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def num_sessions(self) -> int:
        return len(self.session_offsets) - 1

    @property
    def first_turns(self) -> np.ndarray:
        """int64 [num_sessions]: plan index of each session's first request."""
        return self.session_offsets[:-1]

    @property
    def is_multi_turn(self) -> bool:
        return self.num_sessions < self.num_requests

    def session(self, s: int) -> Session:
        """A fresh cursor over session `s` (see `Session`)."""
        return Session(self, s)

    @cached_property
    def _token_list(self) -> list[int]:
        """`token_table` as a list, made on first use: prompts are slices of it."""
        return self.token_table.tolist()

    def materialize(self, i: int) -> list[int]:
        """Prompt token ids of request i (a session's first turn). O(prompt length)."""
        return segment_token_list(
            self._token_list, self.content_key, self._segments(i), self.vocab_size
        )

    def _segments(self, i: int) -> list[tuple[int, int]]:
        """(root, length) segments of request i's prompt (a session's first turn)."""
        self._check(i)
        if self.turns[i] != 0:
            raise WorkloadError(
                f"request {i} is turn {int(self.turns[i])} of a session: its "
                f"prompt extends the previous turn's (use Session.next_prompt)"
            )
        p_len, u_len = int(self.prefix_lens[i]), int(self.user_lens[i])
        segs = [(int(self.prefix_roots[i]), p_len)]
        lo, hi = self.block_offsets[i], self.block_offsets[i + 1]
        if hi > lo:
            segs += block_segments(
                self.block_roots[lo:hi].tolist(), int(self.prompt_lens[i]) - p_len - u_len
            )
        segs.append((int(self.user_roots[i]), u_len))
        return segs

    def user_token_ids(self, i: int) -> list[int]:
        """The `user_lens[i]` new tokens request i appends (to its session's history)."""
        self._check(i)
        segs = [(int(self.user_roots[i]), int(self.user_lens[i]))]
        return segment_token_list(self._token_list, self.content_key, segs, self.vocab_size)

    def cache_salt(self, i: int) -> str | None:
        return self.tenant_salts[int(self.tenants[i])]

    def session_id(self, i: int) -> str | None:
        """`Request.session_id`: set for requests of multi-turn sessions only."""
        s = int(self.sessions[i])
        if self.session_offsets[s + 1] - self.session_offsets[s] == 1:
            return None
        return f"session-{s}"

    def make_request(
        self, i: int, arrival_time: float, prompt_token_ids: list[int] | None = None
    ) -> Request:
        """Request i, created at its arrival time. Later turns pass the prompt that
        `Session.next_prompt` built; first turns materialize their own."""
        prompt = self.materialize(i) if prompt_token_ids is None else prompt_token_ids
        return Request(
            request_id=str(i),
            prompt_token_ids=prompt,
            max_tokens=int(self.output_lens[i]),
            cache_salt=self.cache_salt(i),
            arrival_time=float(arrival_time),
            session_id=self.session_id(i),
        )

    def samples(self, request: Request) -> list[Request]:
        """The requests a prompt is served as: itself (n = 1), or n samples of it, named
        `<k>_<request id>` as vLLM v1's frontend names the child requests of a parallel
        sampling request, arriving together. Each is a request of its own to the engine;
        what they share is the prompt, so later samples hit the first one's cached blocks."""
        if self.n == 1:
            return [request]
        rid = request.request_id
        return [
            Request(
                request_id=f"{k}_{rid}",
                prompt_token_ids=list(request.prompt_token_ids),
                max_tokens=request.max_tokens,
                cache_salt=request.cache_salt,
                arrival_time=request.arrival_time,
                session_id=request.session_id,
                parent_request_id=rid,
            )
            for k in range(self.n)
        ]

    def _check(self, i: int) -> None:
        if not 0 <= i < self.num_requests:
            raise WorkloadError(f"request index {i}: plan has {self.num_requests} requests")
