"""The simulator's model runner: a step's time comes from a cost model, not from a GPU.

It implements the same `ModelRunner` protocol as `pagesim.gpu.runner.GPUModelRunner`, so the
scheduler cannot tell a simulated step from a real one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

from pagesim.cost.base import BatchShape, CostModel, longest_context
from pagesim.scheduler.output import ModelRunnerOutput, SchedulerOutput, sample_synthetic


class CostModelRunner:
    """Executes a step by asking the cost model how long it takes.

    `shared_block_refs` (optional) returns how many block-table entries point at a block that
    another request holds too (`BlockPool.num_shared_refs`): times the block size, the
    context tokens a step reads from shared prefix blocks. It is given only to cost models that
    price such reads (`shared_blocks_counter`); the shapes then carry
    `shared_context_tokens`.
    """

    def __init__(
        self,
        cost_model: CostModel,
        vocab_size: int = 32000,
        shared_block_refs: Callable[[], int] | None = None,
    ) -> None:
        self.cost_model = cost_model
        self.vocab_size = vocab_size
        self.shared_block_refs = shared_block_refs
        # decode-only steps without a BatchShape, where the cost model prices them so
        # (`CalibratedCostModel.decode_step_time`); else through `step_time`
        self._decode_price = getattr(cost_model, "decode_step_time", None)

    def _priced(self, shape: BatchShape) -> float:
        if self.shared_block_refs is not None:
            shape.shared_context_tokens = self.shared_block_refs() * shape.block_size
        return self.cost_model.step_time(shape)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        step_time_s = self._priced(BatchShape.from_scheduler_output(scheduler_output))
        return ModelRunnerOutput(
            step_time_s=step_time_s, sampled_token_ids=self._sample(scheduler_output)
        )

    def execute_with_bulk_decodes(
        self,
        scheduler_output: SchedulerOutput,
        num_bulk: int,
        bulk_context_sum: int,
        bulk_contexts: Sequence[int],
    ) -> ModelRunnerOutput:
        """`execute_model` for a step whose batch also holds `num_bulk` decodes ahead of
        `scheduler_output.scheduled` (see `Scheduler.schedule_bulk`), given by their context sum
        and contexts (tokens, before the step). Their sampled tokens are the caller's
        (`synthetic_token`); only the others' are returned.

        The cost model sees the same `BatchShape` values as for the whole batch in one output.
        """
        if not scheduler_output.scheduled:  # bulk decodes only
            if (
                num_bulk and not scheduler_output.swap_bytes and not scheduler_output.blocks_to_copy
            ):  # nothing else in the step
                return ModelRunnerOutput(
                    step_time_s=self.bulk_decode_step_time(
                        scheduler_output.block_size, num_bulk, bulk_context_sum, bulk_contexts
                    )
                )
            shape = BatchShape(
                scheduler_output.block_size,
                num_bulk,
                num_bulk,
                bulk_context_sum,
                bulk_contexts,
                [],
                [],
                scheduler_output.swap_bytes,
                len(scheduler_output.blocks_to_copy),
            )
            return ModelRunnerOutput(step_time_s=self._priced(shape))
        shape = BatchShape.from_scheduler_output(scheduler_output)
        if num_bulk:
            shape.total_tokens += num_bulk
            shape.num_decode_seqs += num_bulk
            shape.decode_context_sum += bulk_context_sum
            rest = shape.decode_context_tokens
            shape.decode_context_tokens = _Joined(bulk_contexts, rest) if rest else bulk_contexts
        return ModelRunnerOutput(
            step_time_s=self._priced(shape), sampled_token_ids=self._sample(scheduler_output)
        )

    def bulk_decode_step_time(
        self, block_size: int, num_bulk: int, bulk_context_sum: int, bulk_contexts: Sequence[int]
    ) -> float:
        """Step time of a batch of `num_bulk` decodes and nothing else (no swap, no copy): the
        time `execute_with_bulk_decodes` gives for an empty output."""
        price = self._decode_price
        if price is not None:
            refs = self.shared_block_refs
            return price(
                block_size,
                num_bulk,
                bulk_context_sum,
                bulk_contexts,
                refs() * block_size if refs is not None else None,
            )
        return self._priced(
            BatchShape(block_size, num_bulk, num_bulk, bulk_context_sum, bulk_contexts, [], [])
        )

    def _sample(self, scheduler_output: SchedulerOutput) -> dict[str, int]:
        return sample_synthetic(scheduler_output.scheduled, self.vocab_size)


def shared_blocks_counter(cost_model: CostModel, scheduler) -> Callable[[], int] | None:
    """`shared_block_refs` for a runner: the scheduler's shared block references, if its KV
    cache has a block pool and the cost model prices shared-prefix reads; else None (nothing
    to do)."""
    if not getattr(cost_model, "reread_fraction", None):
        return None
    pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    if pool is None:
        return None
    return lambda: pool.num_shared_refs


class _Joined(Sequence):
    """Two sequences read as one (bulk decode contexts, then the scheduled decodes')."""

    __slots__ = ("_a", "_b")

    def __init__(self, a: Sequence[int], b: Sequence[int]) -> None:
        self._a, self._b = a, b

    def __len__(self) -> int:
        return len(self._a) + len(self._b)

    def __getitem__(self, i):
        return list(self)[i]

    def __iter__(self):
        return chain(self._a, self._b)

    def longest(self) -> int:
        """The longest context of either part (`pagesim.cost.base.longest_context`)."""
        return max(longest_context(self._a), longest_context(self._b))
