"""The SimPy engine loop on tiny cases, with every time computed by hand.

Cost model: step = 64 + 1 * tokens UNITs (UNIT = 2**-10 s), so times are exact binary
fractions and are compared with `==`. Notation in the comments: times in UNITs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_helpers import LinearCost, req, step_units, t, tiny_engine

from pagesim.cost.base import BatchShape
from pagesim.metrics import summarize
from pagesim.request import RequestStatus


def test_two_requests_from_t0_exact_timeline() -> None:
    """a: prompt 10, 3 tokens; b: prompt 20, 2 tokens; both at t=0.

    step 0 [0, 94):    a 10 + b 20 prefill = 30 tokens -> 94; a, b first token at 94
    step 1 [94, 160):  a 1 + b 1 decode = 2 -> 66; b done at 160 (2 tokens)
    step 2 [160, 225): a 1 -> 65; a done at 225
    """
    e = tiny_engine()
    e.send(0.0, a := req("a", 10, 3))
    e.send(0.0, b := req("b", 20, 2))
    e.run()

    assert e.step_column("start_time_s") == [0.0, t(94), t(160)]
    assert e.step_column("step_time_s") == [t(94), t(66), t(65)]
    assert e.step_column("num_tokens") == [30, 2, 1]
    assert e.step_column("num_reqs") == [2, 2, 1]
    assert e.step_column("num_prefill_tokens") == [30, 0, 0]
    assert e.step_column("num_decode_reqs") == [0, 2, 1]
    assert e.finished == [(t(160), "b"), (t(225), "a")]
    assert e.env.now == t(225)

    ra, rb = e.metrics.records["a"], e.metrics.records["b"]
    assert (ra.arrival_time, ra.first_scheduled_time, ra.first_token_time, ra.finish_time) == (
        0.0,
        0.0,
        t(94),
        t(225),
    )
    assert (rb.arrival_time, rb.first_scheduled_time, rb.first_token_time, rb.finish_time) == (
        0.0,
        0.0,
        t(94),
        t(160),
    )
    assert ra.num_output_tokens == 3 and rb.num_output_tokens == 2
    # pooled ITL, in token order: a 94->160, b 94->160, a 160->225
    assert list(e.metrics.itl_s) == [t(66), t(66), t(65)]
    assert a.status == b.status == RequestStatus.FINISHED_LENGTH

    s = summarize(e.metrics)
    ms = 1000 * t(1)
    assert s["mean_ttft_ms"] == pytest.approx(94 * ms, rel=1e-12)
    assert s["mean_e2el_ms"] == pytest.approx((225 + 160) / 2 * ms, rel=1e-12)
    # TPOT a = (225 - 94) / 2 = 65.5, b = (160 - 94) / 1 = 66
    assert s["mean_tpot_ms"] == pytest.approx((65.5 + 66) / 2 * ms, rel=1e-12)
    assert s["mean_itl_ms"] == pytest.approx((66 + 66 + 65) / 3 * ms, rel=1e-12)
    assert s["completed"] == 2 and s["total_output_tokens"] == 5
    assert s["max_output_tokens_per_s"] == 5.0 and s["max_concurrent_requests"] == 2
    assert e.kv.num_free_blocks == e.kv.num_usable_blocks


def test_arrival_during_a_step_queues_until_the_step_ends() -> None:
    """a: prompt 10, 3 tokens at 0; b: prompt 20, 2 tokens at 50 (inside step 0).

    step 0 [0, 74):    a prefill 10; a token 1 at 74
    step 1 [74, 159):  a decode 1 + b prefill 20 = 21 -> 85; a token 2, b token 1 at 159
    step 2 [159, 225): a 1 + b 1 -> 66; both done at 225
    b queues 74 - 50 = 24, TTFT 159 - 50 = 109, E2E 175.
    """
    e = tiny_engine()
    e.send(0.0, req("a", 10, 3))
    e.send(t(50), req("b", 20, 2))
    e.run()

    assert e.step_column("start_time_s") == [0.0, t(74), t(159)]
    rb = e.metrics.records["b"]
    assert rb.arrival_time == t(50)
    assert rb.first_scheduled_time - rb.arrival_time == t(24)  # queueing time
    assert rb.first_token_time - rb.arrival_time == t(109)  # TTFT
    assert rb.finish_time - rb.arrival_time == t(175)  # E2E
    ra = e.metrics.records["a"]
    assert (ra.first_token_time, ra.finish_time) == (t(74), t(225))
    assert list(e.metrics.itl_s) == [t(85), t(66), t(66)]


def test_max_num_seqs_makes_the_second_request_queue() -> None:
    """max_num_seqs=1: b (at 0) waits until a finishes and frees its seat.

    step 0 [0, 74): a prefill 10;  step 1 [74, 139): a decode, a done (2 tokens)
    step 2 [139, 213): b prefill 10, b done (1 token). b queues 139, TTFT 213.
    """
    e = tiny_engine(max_num_seqs=1)
    e.send(0.0, req("a", 10, 2))
    e.send(0.0, req("b", 10, 1))
    e.run()
    assert e.step_column("start_time_s") == [0.0, t(74), t(139)]
    rb = e.metrics.records["b"]
    assert rb.first_scheduled_time == t(139)
    assert rb.first_token_time == rb.finish_time == t(213)
    s = summarize(e.metrics)
    assert s["mean_tpot_ms"] == pytest.approx(1000 * t(65), rel=1e-12)  # only a has n > 1


def test_idle_engine_waits_for_arrivals_without_stepping() -> None:
    """Nothing until t=1; a idles the engine again at 1+139 units; b arrives at t=3.

    Time moves only through the steps' timeouts and the arrivals: three steps, no polling.
    """
    e = tiny_engine()
    e.send(1.0, req("a", 10, 2))
    e.send(3.0, req("b", 10, 1))
    e.env.run(until=0.5)
    assert e.metrics.num_steps == 0 and e.engine._idle is not None  # waiting, not stepping
    e.env.run(until=2.0)
    assert e.metrics.num_steps == 2
    assert e.scheduler.has_unfinished_requests() is False
    e.run()
    assert e.step_column("start_time_s") == [1.0, 1.0 + t(74), 3.0]
    assert e.finished == [(1.0 + t(139), "a"), (3.0 + t(74), "b")]
    assert e.env.now == 3.0 + t(74)
    assert math.isinf(e.env.peek())  # nothing scheduled: the engine waits on its idle event
    assert e.metrics.records["b"].first_scheduled_time == 3.0
    # 1-second buckets from t=1: a's two tokens in [1, 2), b's one in [3, 4)
    assert list(e.metrics.token_times_s) == [1.0 + t(74), 1.0 + t(139), 3.0 + t(74)]
    s = summarize(e.metrics)
    assert s["max_output_tokens_per_s"] == 2.0 and s["max_concurrent_requests"] == 1
    assert s["duration"] == 3.0 + t(74)  # from the start of the run, as vllm bench


def test_chunked_prefill_spreads_a_prompt_over_steps() -> None:
    """Budget 16 tokens, prompt 40: chunks 16, 16, 8; no token before the last chunk.

    steps [0, 80), [80, 160), [160, 232) -> first token at 232; decode [232, 297) -> done.
    """
    e = tiny_engine(max_num_batched_tokens=16)
    e.send(0.0, req("a", 40, 2))
    e.run()
    assert e.step_column("num_tokens") == [16, 16, 8, 1]
    assert e.step_column("num_prefill_tokens") == [16, 16, 8, 0]
    assert e.step_column("start_time_s") == [0.0, t(80), t(160), t(232)]
    r = e.metrics.records["a"]
    assert r.first_scheduled_time == 0.0  # the first chunk, not the last, is "scheduled"
    assert (r.first_token_time, r.finish_time) == (t(232), t(297))
    assert list(e.metrics.itl_s) == [t(65)]


def test_chunked_prefill_shares_the_budget_with_decodes() -> None:
    """Budget 16: a (prompt 8, 4 tokens) and b (prompt 40, 2 tokens), both at t=0.

    step 0: a 8 + b 8 (chunk)   -> 80, ends 80;  a token 1
    step 1: a 1 + b 15          -> 80, ends 160; a token 2
    step 2: a 1 + b 15 (b @ 38) -> 80, ends 240; a token 3
    step 3: a 1 + b 2 (prompt done) -> 67, ends 307; a token 4 (done), b token 1
    step 4: b 1                 -> 65, ends 372; b done
    """
    e = tiny_engine(max_num_batched_tokens=16)
    e.send(0.0, req("a", 8, 4))
    e.send(0.0, req("b", 40, 2))
    e.run()
    assert e.step_column("num_tokens") == [16, 16, 16, 3, 1]
    assert e.step_column("start_time_s") == [0.0, t(80), t(160), t(240), t(307)]
    assert e.step_column("step_time_s") == [t(step_units(n)) for n in (16, 16, 16, 3, 1)]
    ra, rb = e.metrics.records["a"], e.metrics.records["b"]
    assert (ra.first_token_time, ra.finish_time) == (t(80), t(307))
    assert (rb.first_token_time, rb.finish_time) == (t(307), t(372))
    s = summarize(e.metrics)
    # TPOT a = (307 - 80) / 3, b = (372 - 307) / 1
    tpots = np.array([(307 - 80) / 3, 65.0]) * 1000 * t(1)
    assert s["mean_tpot_ms"] == pytest.approx(tpots.mean(), rel=1e-12)
    assert s["median_tpot_ms"] == pytest.approx(np.median(tpots), rel=1e-12)


def test_step_time_is_the_cost_models_for_the_scheduled_shape() -> None:
    """The runner hands the cost model the scheduled batch: a 2 ms + 0.5 ms/token model."""
    seen: list[tuple[int, int, list[int]]] = []

    class Recording(LinearCost):
        def step_time(self, batch: BatchShape) -> float:
            seen.append((batch.total_tokens, batch.num_decode_seqs, batch.prefill_new_tokens))
            return 2e-3 + 5e-4 * batch.total_tokens

    e = tiny_engine(cost=Recording())
    e.send(0.0, req("a", 12, 2))
    e.run()
    assert seen == [(12, 0, [12]), (1, 1, [])]
    assert e.env.now == pytest.approx(2e-3 + 6e-3 + 2e-3 + 5e-4, rel=1e-12)


def test_rejected_request_finishes_at_once_and_nothing_is_lost() -> None:
    """A prompt longer than max_model_len is refused on arrival, with a reason; the other runs."""
    e = tiny_engine(max_model_len=64)
    e.send(0.0, req("long", 80, 2))
    e.send(0.0, req("ok", 10, 1))
    e.run()
    rec = e.metrics.records["long"]
    assert rec.reject_reason is not None and rec.reject_reason.startswith("prompt_too_long")
    assert rec.finish_time == 0.0 and rec.first_token_time is None
    assert [rid for _, rid in e.finished] == ["long", "ok"]
    s = summarize(e.metrics)
    assert (s["completed"], s["failed"]) == (1, 1)
    assert e.scheduler.stats.num_rejected == 1


def test_a_step_that_only_preempts_is_progress() -> None:
    """vLLM 0.23, priority policy, equal priorities and arrivals, vLLM's literal tie rule: the
    first running request is its own victim, and vLLM 0.23 then stops scheduling for that
    step. The step schedules no token but frees the victim's blocks; the next step goes on
    (vLLM runs an empty step too)."""
    e = tiny_engine(
        num_gpu_blocks=16,
        block_size=32,
        max_num_batched_tokens=64,
        max_model_len=1024,
        long_prefill_token_threshold=8,
        scheduling_policy="priority",
        enable_prefix_caching=False,
        vllm_compat="0.23",
        literal_victim_ties=True,
    )
    for rid in ("r0", "r1", "r2"):
        e.send(0.0, req(rid, 200, 30))
    e.run()
    assert sorted(rid for _, rid in e.finished) == ["r0", "r1", "r2"]
    empty = [i for i, n in enumerate(e.step_column("num_tokens")) if n == 0]
    assert empty and all(e.step_column("num_preempted")[i] >= 1 for i in empty)
    assert e.kv.num_free_blocks == e.kv.num_usable_blocks
