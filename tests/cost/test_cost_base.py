"""BatchShape from a SchedulerOutput, its constructors, and the CostModel protocol."""

from __future__ import annotations

import pytest

from pagesim.cost.analytical import AnalyticalCostModel
from pagesim.cost.base import BatchShape, CostModel
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.errors import ConfigError
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput


def entry(new: int, computed: int, rid: str = "r") -> ScheduledRequest:
    return ScheduledRequest(Request(rid, [1, 2, 3], 8), new, computed, [0])


def test_all_decode_step_takes_fast_path_and_sums_contexts():
    out = SchedulerOutput(
        3,
        [entry(1, 10, "a"), entry(1, 20, "b"), entry(1, 5, "c")],
        3,
        block_size=32,
        swap_bytes=4096,
        blocks_to_copy=[(1, 2), (3, 4)],
    )
    s = BatchShape.from_scheduler_output(out)
    assert (s.num_decode_seqs, s.decode_context_sum) == (3, 35)
    assert s.decode_context_tokens == [10, 20, 5]
    assert (s.prefill_new_tokens, s.prefill_context_tokens) == ([], [])
    assert (s.total_tokens, s.block_size, s.swap_bytes, s.num_blocks_to_copy) == (3, 32, 4096, 2)
    assert s.is_pure_decode and s.num_reqs == 3 and s.num_prefill_tokens == 0


def test_mixed_step_splits_decode_and_prefill_entries():
    # a chunk over a cached prefix, a whole prompt, and two decodes
    out = SchedulerOutput(
        1, [entry(1, 99, "d1"), entry(256, 512, "c"), entry(40, 0, "p"), entry(1, 7, "d2")], 298
    )
    s = BatchShape.from_scheduler_output(out)
    assert (s.num_decode_seqs, s.decode_context_sum, s.decode_context_tokens) == (2, 106, [99, 7])
    assert (s.prefill_new_tokens, s.prefill_context_tokens) == ([256, 40], [512, 0])
    assert (s.total_tokens, s.num_prefill_tokens, s.num_reqs) == (298, 296, 4)
    assert not s.is_pure_decode


def test_one_token_prompt_without_context_is_prefill_not_decode():
    s = BatchShape.from_scheduler_output(SchedulerOutput(1, [entry(1, 0), entry(1, 4, "x")], 2))
    assert (s.num_decode_seqs, s.prefill_new_tokens, s.prefill_context_tokens) == (1, [1], [0])


def test_total_is_recounted_when_the_field_disagrees():
    # total_num_scheduled_tokens left at its default: the slow path recounts from the entries
    s = BatchShape.from_scheduler_output(SchedulerOutput(1, [entry(1, 3), entry(5, 0, "p")]))
    assert s.total_tokens == 6


def test_empty_output_has_no_tokens():
    s = BatchShape.from_scheduler_output(SchedulerOutput(0, swap_bytes=10))
    assert (s.total_tokens, s.num_reqs, s.swap_bytes) == (0, 0, 10)


def test_constructors_match_scheduler_output():
    out = SchedulerOutput(
        1, [entry(1, 64, str(i)) for i in range(4)] + [entry(128, 256, "p")], 132, block_size=8
    )
    assert BatchShape.mixed(128, 256, 4, 64, block_size=8) == BatchShape.from_scheduler_output(out)
    assert BatchShape.decode(2, 9) == BatchShape(16, 2, 2, 18, [9, 9])
    assert BatchShape.prefill(5, 3, 32) == BatchShape(32, 5, 0, 0, [], [5], [3])


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: BatchShape.decode(0, 10), "batch_size=0"),
        (lambda: BatchShape.decode(1, 0), "context_len=0"),
        (lambda: BatchShape.decode(1, 1, block_size=0), "block_size=0"),
        (lambda: BatchShape.prefill(0), "num_new_tokens=0"),
        (lambda: BatchShape.prefill(4, -1), "num_cached_tokens=-1"),
        (lambda: BatchShape.mixed(0, 0, 1, 1), "num_new_tokens=0"),
    ],
)
def test_constructors_reject_bad_sizes_in_one_line(call, field):
    with pytest.raises(ConfigError, match=field) as err:
        call()
    assert "\n" not in str(err.value)


def test_both_models_implement_the_protocol(llama7b, h200, synthetic_profile):
    assert isinstance(AnalyticalCostModel(llama7b, h200), CostModel)
    assert isinstance(CalibratedCostModel(synthetic_profile), CostModel)
