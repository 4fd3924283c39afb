"""Prompts made as list slices equal the numpy-made ones, token for token."""

from __future__ import annotations

import pytest

from pagesim.workload import load_workload
from pagesim.workload.tokens import TABLE_SIZE, segment_token_list, segment_tokens


@pytest.mark.parametrize("name", ["chat", "system-prompt", "multi-turn", "mooncake-synthetic"])
def test_materialize_equals_array(name: str) -> None:
    plan = load_workload(name).sample(120, seed=3, vocab_size=32000)
    for i in range(plan.num_requests):
        if plan.turns[i] == 0:
            tokens = segment_tokens(
                plan.token_table, plan.content_key, plan._segments(i), plan.vocab_size
            )
            assert plan.materialize(i) == tokens.tolist()
        segs = [(int(plan.user_roots[i]), int(plan.user_lens[i]))]
        assert (
            plan.user_token_ids(i)
            == segment_tokens(plan.token_table, plan.content_key, segs, plan.vocab_size).tolist()
        )


def test_segment_token_list_wraps_like_take() -> None:
    plan = load_workload("chat").sample(2, seed=1, vocab_size=1000)
    segs = [(5, TABLE_SIZE + 40), (9, 3), (11, 1), (12, 0), (2_000_001, 2)]
    assert (
        segment_token_list(plan.token_table.tolist(), plan.content_key, segs, 1000)
        == segment_tokens(plan.token_table, plan.content_key, segs, 1000).tolist()
    )
