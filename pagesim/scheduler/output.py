"""The seam between the scheduler and whoever executes a step.

`Scheduler.schedule()` returns a `SchedulerOutput`; a `ModelRunner` (the simulator's
cost-model runner or the GPU runner) executes it and returns a `ModelRunnerOutput`;
`Scheduler.update_from_output` consumes that. The scheduler cannot tell the two runners apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from pagesim.request import Request


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step.

    Token range written this step (`num_computed_tokens` is the value *before* the step):

        | <- num_computed_tokens -> | <- num_new_tokens -> |
        0                      computed            computed + new  <= request.num_tokens

    The request samples a token at the end of the step iff `computed + new == num_tokens`
    (a prefill chunk that ends before the prompt's end samples nothing).
    """

    request: Request
    num_new_tokens: int  # tokens whose K/V this step computes (query length)
    num_computed_tokens: int  # tokens already in the KV cache before this step (context)
    block_ids: list[int]  # the request's block-table row after this step's allocation
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
        """One new token on top of a computed context: the decode shape."""
        return self.num_new_tokens == 1 and self.num_computed_tokens > 0


@dataclass(slots=True)
class SchedulerOutput:
    """What one engine step must do. Every field is in tokens or block ids unless named."""

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
    def is_empty(self) -> bool:
        return not self.scheduled and not self.blocks_to_swap_out


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


def synthetic_token(request: Request, index: int, vocab_size: int = 32000) -> int:
    """The `index`-th output token of `request`, a pure function of its prompt.

    Both runners emit these tokens (output content is meaningless under ignore_eos), so a
    multi-turn workload can build the next prompt from the previous answer before it is
    generated, and two requests with equal prompts produce equal answers, as greedy decoding
    would. Derived from the last prompt tokens so that it costs O(1).
    """
    p = request.prompt_token_ids
    seed = (p[-1] * 1_000_003 + len(p) * 7919 + (p[0] if p else 0)) if p else 0
    return (seed + 104_729 * (index + 1)) % vocab_size


def synthetic_tokens(request: Request, start: int, stop: int, vocab_size: int = 32000) -> list[int]:
    """`[synthetic_token(request, i, vocab_size) for i in range(start, stop)]`, in one pass."""
    p = request.prompt_token_ids
    seed = (p[-1] * 1_000_003 + len(p) * 7919 + (p[0] if p else 0)) if p else 0
    step = 104_729  # the values seed + step * (i + 1), as a range: no per-token arithmetic
    return [x % vocab_size for x in range(seed + step * (start + 1), seed + step * (stop + 1), step)]
