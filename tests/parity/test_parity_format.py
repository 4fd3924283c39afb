"""The decision-log format, the comparer and the parity workloads (no vLLM needed)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.errors import WorkloadError
from pagesim.parity.compare import compare_logs
from pagesim.parity.decisions import (
    DecisionLog,
    apply_free_queue_edit,
    free_queue_edit,
    ids_to_text,
    text_to_ids,
)
from pagesim.parity.record_pagesim import record
from pagesim.parity.workloads import (
    ParityRequest,
    ParityWorkload,
    chunk_tokens,
    multi_turn,
    output_tokens,
    shared_prefix,
)

ids = st.lists(st.integers(0, 40), max_size=40)


@given(ids)
@settings(max_examples=200)
def test_id_runs_round_trip(xs):
    assert text_to_ids(ids_to_text(xs)) == xs


def test_id_runs_text():
    assert ids_to_text([1, 2, 3, 4, 9, 7, 6, 5]) == "1-4,9,7-5"
    assert text_to_ids("") == []


@given(st.permutations(list(range(30))), st.integers(0, 30), st.integers(0, 30), st.data())
@settings(max_examples=200)
def test_free_queue_edit_reproduces_any_queue_change(perm, n_prev, n_cur, data):
    prev = list(perm[:n_prev])
    cur = data.draw(st.permutations(list(perm)))[:n_cur]
    edit = free_queue_edit(prev, cur)
    assert apply_free_queue_edit(prev, edit) == cur


def test_free_queue_edit_is_small_for_engine_moves():
    prev = list(range(1, 11))
    cur = [42, 41] + [3, 4, 6, 7, 8, 9, 10] + [2, 1]  # pop 2, touch 5, free at both ends
    assert free_queue_edit(prev, cur) == ([42, 41], 2, [5], [2, 1])
    assert free_queue_edit(prev, prev) is None
    assert free_queue_edit(prev, prev[3:]) == ([], 3, [], [])


def _tiny_workload() -> ParityWorkload:
    reqs = (
        ParityRequest("a", (("k", 1, 40),), 5),
        ParityRequest("b", (("k", 1, 40), ("k", 2, 9)), 4, arrival_step=1),
        ParityRequest("c", (("k", 3, 60),), 30, arrival_step=1),
        ParityRequest("d", (("k", 1, 40), ("o", "a"), ("k", 4, 20)), 6, after="a", delay=2),
    )
    engine = {
        "block_size": 16,
        "num_gpu_blocks": 9,
        "max_num_batched_tokens": 64,
        "max_num_seqs": 4,
        "max_model_len": 256,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "long_prefill_token_threshold": 0,
        "scheduling_policy": "fcfs",
        "scheduler_reserve_full_isl": True,
    }
    return ParityWorkload("tiny", 7, reqs, engine)


def test_log_round_trips_through_json(tmp_path):
    log = record(_tiny_workload())
    for name in ("log.json", "log.json.gz"):
        back = DecisionLog.read(log.write(tmp_path / name))
        assert back.steps == log.steps and back.summary() == log.summary()
    assert log.summary()["finished"] == 4
    again = log.write(tmp_path / "again.json.gz").read_bytes()
    assert (tmp_path / "log.json.gz").read_bytes() == again  # gzip without a timestamp


def test_dependent_request_arrives_after_its_parent_finished():
    log = record(_tiny_workload())
    fin_a = next(s.t for s in log.steps if "a" in s.finished)
    add_d = next(s.t for s in log.steps if "d" in s.added)
    assert add_d == fin_a + 1 + 2
    hit_d = dict(h for s in log.steps for h in s.hits)["d"]
    assert hit_d >= 32  # the shared 40-token chunk plus a's answer: two full blocks at least


def test_compare_reports_the_first_changed_decision():
    log = record(_tiny_workload())
    other = copy.deepcopy(log)
    k = next(i for i, s in enumerate(other.steps) if len(s.scheduled) > 1)
    rid, n = other.steps[k].scheduled[1]
    other.steps[k].scheduled[1] = (rid, n - 1)
    report = compare_logs(log, other)
    assert not report.ok and report.divergence.step_index == k
    assert report.divergence.what == "scheduled" and report.divergence.request_id == rid
    assert f"t={log.steps[k].t}" in report.format()
    assert compare_logs(log, copy.deepcopy(log)).ok


def _renamed(log: DecisionLog, mapping: dict[int, int]) -> DecisionLog:
    out = copy.deepcopy(log)
    out.initial_free_queue = [mapping[b] for b in out.initial_free_queue]
    for s in out.steps:
        s.new_blocks = [(r, [mapping[b] for b in bl]) for r, bl in s.new_blocks]
        s.evicted = [mapping[b] for b in s.evicted]
        if s.free_queue_edit is not None:
            h, p, d, t = s.free_queue_edit
            s.free_queue_edit = (
                [mapping[b] for b in h],
                p,
                [mapping[b] for b in d],
                [mapping[b] for b in t],
            )
    return out


def test_block_ids_may_differ_only_by_one_consistent_renaming():
    log = record(_tiny_workload())
    shift = {b: b + 100 for b in range(9)}
    assert not compare_logs(log, _renamed(log, shift)).ok
    assert compare_logs(log, _renamed(log, shift), block_ids="renamed").ok
    # the initial free queue binds every id; a later block that breaks the binding diverges
    bad = _renamed(log, shift)
    step = next(s for s in bad.steps if s.new_blocks)
    rid, blocks = step.new_blocks[0]
    other = next(b for b in shift.values() if b != blocks[0] and b != 100)
    step.new_blocks[0] = (rid, [other] + blocks[1:])
    report = compare_logs(log, bad, block_ids="renamed")
    assert not report.ok and report.divergence.what == "block ids"


def test_chunk_tokens_prefix_property_and_determinism():
    assert chunk_tokens(4, 17, 100)[:37] == chunk_tokens(4, 17, 37)
    assert chunk_tokens(4, 17, 50) == chunk_tokens(4, 17, 50)
    assert chunk_tokens(4, 17, 50) != chunk_tokens(4, 18, 50)


def test_multi_turn_prompt_extends_the_previous_turn():
    wl = multi_turn()
    req = next(r for r in wl.requests if r.after is not None)
    prev = wl.request(req.after)
    history = wl.prompt(prev.request_id) + output_tokens(
        wl.prompt(prev.request_id), prev.max_tokens
    )
    assert wl.prompt(req.request_id)[: len(history)] == history


def test_workload_json_round_trip_and_digest_check():
    wl = shared_prefix()
    d = wl.to_json()
    assert ParityWorkload.from_json(d) == wl
    d["prompt_digests"][3] = "000000000000"
    with pytest.raises(WorkloadError, match="r3"):
        ParityWorkload.from_json(d)


def test_stalled_replay_raises():
    wl = _tiny_workload()
    big = dataclasses.replace(
        wl,
        requests=(ParityRequest("z", (("k", 9, 200),), 1),),
        engine=dict(wl.engine, max_model_len=4096),
    )
    with pytest.raises(Exception, match="z|stall|fit|reject"):
        record(big)
