"""The seam between the scheduler and whoever executes a step.

`Scheduler.schedule()` returns a `SchedulerOutput`; a `ModelRunner` (the simulator's
cost-model runner or the GPU runner) executes it and returns a `ModelRunnerOutput`;
`Scheduler.update_from_output` consumes that. The scheduler cannot tell the two runners apart.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from math import gcd
from typing import Protocol

from pagesim.request import Request

#: A request's block-table row, or under the hybrid KV cache manager one row per KV cache group.
BlockIds = list[int] | tuple[list[int], ...]


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    Token range written this step (`num_computed_tokens` is the value *before* the step):

        | <- num_computed_tokens -> | <- num_new_tokens -> |
        0                      computed            computed + new  <= request.num_tokens

    The request samples a token at the end of the step iff `computed + new == num_tokens`
    (a prefill chunk that ends before the prompt's end samples nothing).

    Block ids travel as vLLM's `NewRequestData` / `CachedRequestData` carry them: a runner
    keeps every live request's row and is sent only what changed. A row
    that had entries replaced in place (a copy-on-write fork's private copy, blocks released
    by a sliding window) is sent whole, as vLLM sends a resumed request's row.
    """

    request: Request
    num_new_tokens: int  # tokens whose K/V this step computes (query length)
    num_computed_tokens: int  # tokens already in the KV cache before this step (context)
    # The whole row(s) after this step's allocation, to replace what the runner holds: a
    # request scheduled for the first time, resumed, or whose row changed in place. None: the
    # runner's row only grows, by `new_block_ids`.
    block_ids: BlockIds | None
    # Ids appended to the row (per KV cache group) this step, when `block_ids` is None.
    new_block_ids: BlockIds = ()
    resumed: bool = False  # first step after a preemption (recompute) or swap-in
    first_scheduled: bool = False  # first step ever of this request (it was WAITING, never run)
    # Prefix-cache hit found when this step admitted the request (new or recompute-resumed),
    # in tokens; those tokens are part of num_computed_tokens and are not computed. 0 otherwise.
    num_prefix_hit_tokens: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_decode(self) -> bool:
        return is_decode(self.num_new_tokens, self.num_computed_tokens)


def is_decode(num_new_tokens: int, num_computed_tokens: int) -> bool:
    """One new token on top of a computed context: the decode shape, the one test the cost
    model, the GPU kernels and graphs and both worlds' step records apply (a one-token prompt
    with nothing cached is a prefill: it has no context to read)."""
    return num_new_tokens == 1 and num_computed_tokens > 0


@dataclass(slots=True)
class SchedulerOutput:
    """What one engine step must do. Every field is in tokens or block ids unless named.

    A runner that keeps block-table rows must see every step's output: the simulator's bulk
    decodes (`Scheduler.schedule_bulk`) grow rows that no output reports.
    """

    step_id: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)  # running order
    total_num_scheduled_tokens: int = 0  # sum of num_new_tokens
    block_size: int = 16  # tokens per KV block
    finished_req_ids: list[str] = field(default_factory=list)  # freed since the last step
    preempted_req_ids: list[str] = field(default_factory=list)  # preempted in this schedule()
    # Refused by add_request since the last step (FINISHED_REJECTED, Request.reject_reason).
    rejected_req_ids: list[str] = field(default_factory=list)
    # Copy-on-write: (src_block_id, dst_block_id) to copy on the GPU before the step.
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # Swap preemption: (gpu_block_id, cpu_block_id) pairs to move before the step.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (cpu, gpu)
    swap_bytes: int = 0  # bytes over the host link (out + in) this step

    @property
    def num_reqs(self) -> int:
        return len(self.scheduled)

    @property
    def num_decodes(self) -> int:
        """Entries in the decode shape (`is_decode`): one token each."""
        return sum(1 for sr in self.scheduled if sr.is_decode)


@dataclass(slots=True)
class ModelRunnerOutput:
    """What a runner reports back for one step."""

    step_time_s: float  # wall time of the step: predicted (simulator) or measured (GPU)
    # request_id -> sampled token, for each request that completed its tokens this step
    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    # Optional breakdown for calibration and metrics (seconds); empty if unknown.
    time_breakdown_s: dict[str, float] = field(default_factory=dict)


class ModelRunner(Protocol):
    """Executes scheduled steps. Implemented by `sim.CostModelRunner` and `gpu.GPUModelRunner`."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput: ...


_TOKEN_STEP = 104_729  # synthetic_token's stride between consecutive output tokens


def _token_seed(prompt: list[int]) -> int:
    return (prompt[-1] * 1_000_003 + len(prompt) * 7919 + prompt[0]) if prompt else 0


def synthetic_token(request: Request, index: int, vocab_size: int = 32000) -> int:
    """The `index`-th output token of `request`, a pure function of its prompt.

    Both runners emit these tokens (output content is meaningless under ignore_eos), so a
    multi-turn workload can build the next prompt from the previous answer before it is
    generated, and two requests with equal prompts produce equal answers, as greedy decoding
    would. Derived from the last prompt tokens so that it costs O(1).
    """
    return (_token_seed(request.prompt_token_ids) + _TOKEN_STEP * (index + 1)) % vocab_size


def sample_synthetic(scheduled: list[ScheduledRequest], vocab_size: int) -> dict[str, int]:
    """request_id -> its next `synthetic_token`, for each scheduled request that samples.

    A request samples when its step brings its K/V up to all its tokens; a prefill chunk that
    stops inside the prompt samples nothing. Both runners call this after every step.
    """
    sampled: dict[str, int] = {}
    step = _TOKEN_STEP
    for sr in scheduled:
        req = sr.request
        prompt, output = req.prompt_token_ids, req.output_token_ids
        n_out = len(output)
        if sr.num_computed_tokens + sr.num_new_tokens >= len(prompt) + n_out:
            sampled[req.request_id] = (_token_seed(prompt) + step * (n_out + 1)) % vocab_size
    return sampled


def synthetic_tokens(request: Request, start: int, stop: int, vocab_size: int = 32000) -> list[int]:
    """`[synthetic_token(request, i, vocab_size) for i in range(start, stop)]`, in one pass."""
    seed = _token_seed(request.prompt_token_ids)
    step = _TOKEN_STEP  # the values seed + step * (i + 1), as a range: no per-token arithmetic
    return [
        x % vocab_size for x in range(seed + step * (start + 1), seed + step * (stop + 1), step)
    ]


class SyntheticTokenTable:
    """Every request's synthetic output tokens as windows of one cyclic table (built once per
    vocabulary), so that a run of them is a list slice and a full block of them, packed as
    little-endian int32 for hashing, is a bytes slice: no per-token Python work.

    Why a window: with a = 104_729 mod V invertible mod V, token i of a request whose prompt
    seed is s is (s + a (i + 1)) mod V = a (t + i + 1) mod V = table[t + i + 1] for
    t = s a^-1 mod V and table[k] = a k mod V (period V). `start(request)` is the table index
    of the request's token 0. When a is not invertible (V a multiple of 104_729) or the table
    would not give a window, callers fall back to `synthetic_tokens` (`usable` is False).
    """

    __slots__ = ("vocab_size", "usable", "packed_table", "_inv", "_tokens")

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size={vocab_size}: must be >= 1")
        self.vocab_size = vocab_size
        a = _TOKEN_STEP % vocab_size
        self.usable = gcd(a, vocab_size) == 1
        self._inv = pow(a, -1, vocab_size) if self.usable else 0
        period = [a * k % vocab_size for k in range(vocab_size)] if self.usable else []
        self._tokens: list[int] = period + period  # any window of <= V tokens is one slice
        # The table as little-endian int32: token k of the table is bytes [4k, 4k + 4).
        self.packed_table = struct.pack(f"<{len(self._tokens)}i", *self._tokens)

    def start(self, request: Request) -> int:
        """Table index of the request's output token 0, in [0, V)."""
        v = self.vocab_size
        return ((_token_seed(request.prompt_token_ids) % v) * self._inv + 1) % v

    def tokens(self, start: int, first: int, stop: int) -> list[int]:
        """Output tokens [first, stop) of the request whose token 0 is at `start`
        (`synthetic_tokens(request, first, stop)`)."""
        v = self.vocab_size
        k = (start + first) % v
        n = stop - first
        if n <= v:
            return self._tokens[k : k + n]
        out: list[int] = []
        while n > 0:
            m = n if n <= v else v
            out += self._tokens[k : k + m]
            n -= m
        return out

    def packed(self, start: int, first: int, count: int) -> bytes | None:
        """Output tokens [first, first + count) as `count` little-endian int32 (the bytes a
        block hash packs), or None when they do not fit one window (count > V)."""
        if count > self.vocab_size:
            return None
        k = (start + first) % self.vocab_size
        return self.packed_table[4 * k : 4 * (k + count)]
