"""The request entity shared by the scheduler, the KV cache and both runners.

Mirrors vLLM v1's `Request`: there is no prefill or decode phase; a request only has
`num_tokens` (prompt + generated) and `num_computed_tokens` (tokens whose K/V is in the cache),
and the scheduler makes the second catch up with the first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class RequestStatus(enum.IntEnum):
    """Lifecycle of a request. Values above `PREEMPTED` are terminal."""

    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2  # freed (recompute) and back in the waiting queue
    SWAPPED = 3  # blocks copied to the CPU swap pool, waiting to swap back in
    FINISHED_LENGTH = 4  # produced max_tokens (vllm bench runs with ignore_eos)
    FINISHED_REJECTED = 5  # cannot ever be served: see `Request.reject_reason`

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_LENGTH


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    `prompt_token_ids` carry the identity of the prompt for prefix caching; output tokens are
    synthetic (the simulated and the random-weight model both ignore EOS, as `vllm bench` does
    with `--ignore-eos`), so only their count matters, but they are appended so that block
    hashes of generated blocks are well defined.
    """

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int  # output tokens to generate (the workload's output length)
    cache_salt: str | None = None  # per-tenant salt: mixed into the first block's hash
    arrival_time: float = 0.0  # seconds, simulation (or wall-clock replay) time
    priority: int = 0  # lower value is served first under the `priority` policy
    lora_name: str | None = None  # extra hash key: different adapters never share K/V
    session_id: str | None = None  # multi-turn session this request belongs to, if any
    # The prompt this request is one sample of (parallel sampling, n > 1), if any.
    parent_request_id: str | None = None

    # ---- mutable state, owned by the scheduler ----
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V is written (or found in the prefix cache)
    num_cached_tokens: int | None = None  # prefix-cache hit of the first admission, in tokens
    num_preemptions: int = 0
    reject_reason: str | None = None
    arrival_rank: int = 0  # order of `Scheduler.add_request`: breaks ties between victims
    # Chained hashes of the full blocks of prompt+output, maintained by the KV cache manager.
    block_hashes: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_token_ids, list):  # a list is taken as is: no copy
            self.prompt_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: the length the K/V cache must eventually hold."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_num_tokens(self) -> int:
        """Length of the sequence once finished: prompt + max_tokens."""
        return len(self.prompt_token_ids) + self.max_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt+output without concatenating the whole sequence."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    @property
    def is_finished(self) -> bool:
        return self.status >= RequestStatus.FINISHED_LENGTH
