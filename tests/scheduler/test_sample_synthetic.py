"""`sample_synthetic`, the sampling both runners share, is `synthetic_token` of exactly the
requests whose step brings their K/V up to all their tokens."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, sample_synthetic, synthetic_token


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 200_000), min_size=1, max_size=6),
            st.integers(0, 5),
            st.integers(0, 12),
            st.integers(1, 8),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([1, 7, 32_000, 128_256]),
)
def test_sample_synthetic_is_synthetic_token_of_the_requests_that_sample(seqs, vocab) -> None:
    scheduled, want = [], {}
    for i, (prompt, num_out, computed, new) in enumerate(seqs):
        req = Request(f"r{i}", prompt, max_tokens=num_out + 8)
        req.output_token_ids.extend(range(num_out))
        computed = min(computed, req.num_tokens - 1)
        scheduled.append(ScheduledRequest(req, new, computed, [1]))
        if computed + new >= req.num_tokens:
            want[req.request_id] = synthetic_token(req, num_out, vocab)
    assert sample_synthetic(scheduled, vocab) == want
