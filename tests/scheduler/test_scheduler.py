"""Scheduling decisions pinned step by step: chunking, admission order, limits, prefix hits.

Block ids follow the KV cache manager's vLLM semantics: block 0 is the null block and free
blocks are handed out lowest id first on a fresh pool.
"""

from __future__ import annotations

import pytest
from sched_helpers import (
    follow_rows,
    make_config,
    make_kv,
    make_scheduler,
    req,
    run_step,
    tables,
    tokens,
)

from pagesim.errors import InternalError, WorkloadError
from pagesim.request import RequestStatus
from pagesim.scheduler import ModelRunnerOutput, Scheduler


def test_chunked_prefill_under_the_token_budget() -> None:
    s = make_scheduler(32, max_num_batched_tokens=64)
    r1, r2 = req("r1", 100, max_tokens=2), req("r2", 50, max_tokens=2)
    s.add_request(r1)
    s.add_request(r2)
    out, _ = run_step(s)  # r1 takes the whole budget; r2 waits for budget
    assert tokens(out) == {"r1": 64}
    assert out.scheduled[0].block_ids == [1, 2, 3, 4] and out.scheduled[0].first_scheduled
    assert r1.num_computed_tokens == 64 and r1.output_token_ids == []  # a chunk samples nothing
    out, _ = run_step(s)  # running first: r1's last 36, then a 28-token chunk of r2
    assert tokens(out) == {"r1": 36, "r2": 28}
    assert [sr.num_computed_tokens for sr in out.scheduled] == [64, 0]
    assert out.scheduled[0].block_ids is None and out.scheduled[0].new_block_ids == [5, 6, 7]
    assert tables(s)["r1"] == [1, 2, 3, 4, 5, 6, 7] and out.scheduled[1].block_ids == [8, 9]
    assert r1.num_output_tokens == 1 and r2.num_output_tokens == 0
    out, finished = run_step(s)
    assert tokens(out) == {"r1": 1, "r2": 22} and out.total_num_scheduled_tokens == 23
    assert finished == [r1] and r1.status == RequestStatus.FINISHED_LENGTH
    assert s.kv_cache_manager.get_block_ids("r1") == []
    out, finished = run_step(s)
    assert tokens(out) == {"r2": 1} and out.finished_req_ids == ["r1"] and finished == [r2]
    assert not s.has_unfinished_requests()
    assert s.kv_cache_manager.num_free_blocks == 31
    assert s.schedule().finished_req_ids == ["r2"]


def test_long_prefill_token_threshold_caps_every_chunk() -> None:
    s = make_scheduler(32, max_num_batched_tokens=64, long_prefill_token_threshold=20)
    for r in (req("r1", 100), req("r2", 50), req("r3", 10)):
        s.add_request(r)
    assert tokens(run_step(s)[0]) == {"r1": 20, "r2": 20, "r3": 10}
    assert tokens(run_step(s)[0]) == {"r1": 20, "r2": 20, "r3": 1}
    assert tokens(run_step(s)[0]) == {"r1": 20, "r2": 10, "r3": 1}


def test_partial_prefills_default_threshold_as_vllm_023() -> None:
    # vLLM 0.23: max_num_partial_prefills > 1 with no threshold -> 4% of max_model_len;
    # vLLM 0.33 has no max_num_partial_prefills
    kw = dict(max_num_partial_prefills=2, max_model_len=500)
    assert make_scheduler(32, vllm_compat="0.23", **kw).long_prefill_token_threshold == 20
    assert make_scheduler(32, vllm_compat="0.33", **kw).long_prefill_token_threshold == 0


@pytest.mark.parametrize("compat,alone", [("0.33", 64), ("0.23", 20)])
def test_long_prefill_threshold_and_a_lone_request(compat: str, alone: int) -> None:
    # vLLM 0.33 does not cap a request that is alone (running + waiting == 1)
    s = make_scheduler(
        32, max_num_batched_tokens=64, long_prefill_token_threshold=20, vllm_compat=compat
    )
    s.add_request(req("r1", 100))
    assert tokens(run_step(s)[0]) == {"r1": alone}
    s.add_request(req("r2", 100))
    assert tokens(run_step(s)[0]) == {"r1": 20, "r2": 20}


@pytest.mark.parametrize("policy,order", [("fcfs", ["a", "b", "c"]), ("priority", ["c", "b", "a"])])
def test_admission_order(policy: str, order: list[str]) -> None:
    s = make_scheduler(16, max_num_seqs=1, scheduling_policy=policy)
    s.add_request(req("a", 4, max_tokens=1, priority=3, arrival_time=0.0))
    s.add_request(req("b", 4, max_tokens=1, priority=1, arrival_time=2.0))
    s.add_request(req("c", 4, max_tokens=1, priority=1, arrival_time=1.0))
    seen = []
    for _ in range(3):
        out, finished = run_step(s)
        seen += list(tokens(out))
        assert [r.request_id for r in finished] == seen[-1:]
    assert seen == order


def test_max_num_seqs_limits_running_requests() -> None:
    s = make_scheduler(16, max_num_seqs=2)
    for r in (req("r1", 10, max_tokens=3), req("r2", 10, max_tokens=3), req("r3", 10)):
        s.add_request(r)
    out, _ = run_step(s)
    assert tokens(out) == {"r1": 10, "r2": 10} and s.get_request_counts() == (2, 1)
    assert tokens(run_step(s)[0]) == {"r1": 1, "r2": 1}
    out, finished = run_step(s)
    assert tokens(out) == {"r1": 1, "r2": 1} and len(finished) == 2
    assert tokens(run_step(s)[0]) == {"r3": 10}
    assert s.get_request_counts() == (1, 0)


def test_without_chunked_prefill_a_prompt_waits_for_budget() -> None:
    kw = dict(max_num_batched_tokens=64, max_model_len=64)
    s = make_scheduler(32, enable_chunked_prefill=False, **kw)
    for r in (req("r1", 40), req("r2", 30), req("r3", 10)):
        s.add_request(r)
    # r2 does not fit in the 24 left; admission stops there, r3 behind it waits too (vLLM)
    assert tokens(run_step(s)[0]) == {"r1": 40}
    assert tokens(run_step(s)[0]) == {"r1": 1, "r2": 30, "r3": 10}
    chunked = make_scheduler(32, **kw)
    for r in (req("r1", 40), req("r2", 30), req("r3", 10)):
        chunked.add_request(r)
    assert tokens(run_step(chunked)[0]) == {"r1": 40, "r2": 24}


def test_prefix_hits_skip_computation_and_full_hit_recomputes_last_block() -> None:
    s = make_scheduler(16, max_num_batched_tokens=128)
    a = req("a", list(range(1, 41)))  # 2 full blocks + 8 tokens
    b = req("b", list(range(1, 33)) + [7] * 8)  # shares a's 2 full blocks
    c = req("c", list(range(1, 33)))  # exactly a's 2 full blocks
    for r in (a, b, c):
        s.add_request(r)
    out = s.schedule()  # a's blocks are cached when allocated: b and c hit them in this step
    assert tokens(out) == {"a": 40, "b": 8, "c": 16}
    assert [sr.num_computed_tokens for sr in out.scheduled] == [0, 32, 16]
    assert [sr.num_prefix_hit_tokens for sr in out.scheduled] == [0, 32, 16]
    assert [sr.block_ids for sr in out.scheduled] == [[1, 2, 3], [1, 2, 4], [1, 5]]
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 32, 16)
    assert out.total_num_scheduled_tokens == 40 + 40 + 32 - 48
    assert s.stats.num_prefix_query_tokens == 112 and s.stats.num_prefix_hit_tokens == 48
    assert all(r.num_computed_tokens == r.num_tokens for r in (a, b, c))


def test_no_prefix_hit_without_caching() -> None:
    cfg = make_config(enable_prefix_caching=False, max_num_batched_tokens=128)
    s = Scheduler(cfg, make_kv(16, enable_caching=False))
    for r in (req("a", list(range(40))), req("b", list(range(40)))):
        s.add_request(r)
    assert tokens(s.schedule()) == {"a": 40, "b": 40}


def test_update_from_output_appends_finishes_and_checks_the_runner() -> None:
    s = make_scheduler(16)
    r = req("r", 20, max_tokens=2)
    s.add_request(r)
    out = s.schedule()
    with pytest.raises(InternalError, match="request_id='r'.*no sampled token"):
        s.update_from_output(out, ModelRunnerOutput(0.01, {}))
    assert s.update_from_output(out, ModelRunnerOutput(0.01, {"r": 5})) == []
    assert r.output_token_ids == [5] and r.num_computed_tokens == 20
    out = s.schedule()
    assert out.scheduled[0].is_decode and out.scheduled[0].num_computed_tokens == 20
    assert s.update_from_output(out, ModelRunnerOutput(0.01, {"r": 9})) == [r]
    assert r.output_token_ids == [5, 9] and r.status == RequestStatus.FINISHED_LENGTH
    assert s.stats.num_finished == 1 and not s.requests


def test_rejections_with_reasons_and_nothing_lost() -> None:
    s = make_scheduler(6, max_model_len=128)  # 5 usable blocks: 80 tokens of K/V
    cases = {
        "empty": (req("empty", []), "empty_prompt"),
        "zero": (req("zero", 4, max_tokens=0), "invalid_max_tokens"),
        "long": (req("long", 129, max_tokens=1), "prompt_too_long"),
        "over": (req("over", 100, max_tokens=29), "max_tokens_too_large"),
        "kvbig": (req("kvbig", 60, max_tokens=22), "kv_cache_too_small"),
    }
    accepted = [req("fit", 60, max_tokens=21), req("ok", 10, max_tokens=3)]
    for r, _ in cases.values():
        assert s.add_request(r) is False
    for r in accepted:
        assert s.add_request(r) is True
    for r, code in cases.values():
        assert r.status == RequestStatus.FINISHED_REJECTED
        assert r.reject_reason.split(":")[0] == code, r.reject_reason
    first = s.schedule()
    follow_rows(s, first)
    assert first.rejected_req_ids == list(cases)
    s.update_from_output(
        first, ModelRunnerOutput(0.0, {sr.request_id: 1 for sr in first.scheduled})
    )
    while s.has_unfinished_requests():
        run_step(s)
    assert all(r.num_output_tokens == r.max_tokens for r in accepted)
    st = s.stats
    assert (st.num_added, st.num_finished, st.num_rejected) == (7, 2, 5)
    assert st.num_finished + st.num_rejected == st.num_added


def test_bad_add_raises() -> None:
    s = make_scheduler(16)
    s.add_request(req("a", 4))
    with pytest.raises(WorkloadError, match="request_id='a': already added"):
        s.add_request(req("a", 4))
    done = req("b", 4)
    done.status = RequestStatus.RUNNING
    with pytest.raises(WorkloadError, match="request_id='b'"):
        s.add_request(done)


def test_abort_frees_and_counts() -> None:
    s = make_scheduler(16, max_num_seqs=1)
    a, b = req("a", 20, max_tokens=8), req("b", 20)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    assert s.finish_requests(["a", "b", "nope"]) == [a, b]
    assert a.status == b.status == RequestStatus.FINISHED_REJECTED and a.reject_reason == "aborted"
    assert not s.has_unfinished_requests() and s.kv_cache_manager.num_free_blocks == 15
    assert s.schedule().finished_req_ids == ["a", "b"]
    assert s.stats.num_aborted == 2 and s.stats.num_rejected == 2
