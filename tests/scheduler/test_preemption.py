"""Preemption pinned step by step: victims, recompute and swap round trips, swap fallback.

Small blocks (4 tokens) keep the arithmetic visible. In the two-request scenario, a and b have
8-token prompts and 8 output tokens; with 6 usable blocks both fit until step 5, when a needs
its 4th block and none is free:

    step  0: a 8, b 8     a [1,2]     b [3,4]
    step  1: a 1, b 1     a [1,2,5]   b [3,4,6]        (free: none)
    steps 2-4: decodes, no new block
    step  5: a needs block 4 -> victim b (last admitted); b's blocks [3,4,6] are freed tail
             first, all hashed, to the free queue's tail: [6,4,3]; a takes 6
"""

from __future__ import annotations

import pytest
from sched_helpers import make_config, make_kv, make_scheduler, req, run_step, tables, tokens

from pagesim.request import RequestStatus
from pagesim.scheduler import CPUSwapPool, Scheduler
from pagesim.scheduler.preemption import select_victim_index


def two_request_scheduler(**kw) -> Scheduler:
    pool = kw.pop("swap_pool", None)
    cfg = make_config(block_size=4, **kw)
    s = Scheduler(cfg, make_kv(7, block_size=4), swap_pool=pool)
    s.add_request(req("a", 8, max_tokens=8))
    s.add_request(req("b", 8, max_tokens=8))
    return s


def run_until_preemption(s: Scheduler):
    outs = [run_step(s)[0] for _ in range(2)]
    assert tables(s)["b"] == [3, 4, 6] and outs[1].scheduled[1].new_block_ids == [6]
    outs += [run_step(s)[0] for _ in range(4)]
    assert [tokens(o) for o in outs[:5]] == [{"a": 8, "b": 8}] + [{"a": 1, "b": 1}] * 4
    assert all(not o.preempted_req_ids for o in outs[:5])
    return outs[5]


def test_recompute_round_trip() -> None:
    s = two_request_scheduler()
    a, b = s.requests["a"], s.requests["b"]
    out = run_until_preemption(s)
    assert tokens(out) == {"a": 1} and out.preempted_req_ids == ["b"]
    assert tables(s)["a"] == [1, 2, 5, 6]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_preemptions == 1 and b.num_tokens == 13
    assert s.kv_cache_manager.get_block_ids("b") == []
    assert s.waiting.peek_request() is b
    # b's full prompt (13 tokens, 4 blocks) does not fit while a runs: it waits
    assert tokens(run_step(s)[0]) == {"a": 1}
    out, finished = run_step(s)
    assert tokens(out) == {"a": 1} and finished == [a]
    # a freed [1,2,5,6]: 6 (partial, no hash) to the head -> [6,4,3,5,2,1]. b hits its own
    # two prompt blocks [3,4] (its third block, 6, was reused by a) and recomputes 5 tokens.
    out, _ = run_step(s)
    sr = out.scheduled[0]
    assert tokens(out) == {"b": 5} and sr.resumed and not sr.first_scheduled
    assert (sr.num_computed_tokens, sr.num_prefix_hit_tokens) == (8, 8)
    assert sr.block_ids == [3, 4, 6, 5]
    st = s.stats
    assert (st.num_preemptions, st.preempted_computed_tokens, st.recomputed_tokens) == (1, 12, 4)
    while s.has_unfinished_requests():
        run_step(s)
    assert b.num_output_tokens == 8 and b.status == RequestStatus.FINISHED_LENGTH


def test_swap_round_trip_and_swap_in_before_admission() -> None:
    pool = CPUSwapPool(num_blocks=8, page_size_bytes=1000)
    s = two_request_scheduler(preemption_mode="swap", swap_pool=pool)
    a, b = s.requests["a"], s.requests["b"]
    out = run_until_preemption(s)
    assert tokens(out) == {"a": 1} and out.preempted_req_ids == ["b"]
    assert out.blocks_to_swap_out == [(3, 0), (4, 1), (6, 2)] and out.swap_bytes == 3000
    assert b.status == RequestStatus.SWAPPED and b.num_computed_tokens == 12
    assert s.num_swapped == 1 and pool.num_free_blocks == 5
    s.add_request(req("w", 4, max_tokens=1))  # would fit, but swap-in goes first
    for _ in range(2):  # b needs 4 GPU blocks; 2 are free while a runs
        out, finished = run_step(s)
        assert tokens(out) == {"a": 1} and not out.blocks_to_swap_in
    assert finished == [a]
    out, _ = run_step(s)
    assert tokens(out) == {"b": 1, "w": 4}
    sr = out.scheduled[0]
    assert sr.resumed and sr.num_computed_tokens == 12 and sr.block_ids == [6, 4, 3, 5]
    assert out.blocks_to_swap_in == [(0, 6), (1, 4), (2, 3)] and out.swap_bytes == 3000
    assert pool.num_free_blocks == 8
    st = s.stats
    assert (st.num_swap_preemptions, st.swapped_out_bytes, st.swapped_in_bytes) == (1, 3000, 3000)
    assert st.recomputed_tokens == 0 and st.preempted_computed_tokens == 0
    while s.has_unfinished_requests():
        run_step(s)
    assert b.num_output_tokens == 8


def test_full_swap_pool_falls_back_to_recompute() -> None:
    s = two_request_scheduler(preemption_mode="swap", swap_pool=CPUSwapPool(2, 1000))
    b = s.requests["b"]
    out = run_until_preemption(s)
    assert out.preempted_req_ids == ["b"] and out.blocks_to_swap_out == [] and out.swap_bytes == 0
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert s.stats.num_swap_fallbacks == 1 and s.stats.num_swap_preemptions == 0
    assert s.waiting.peek_request() is b and s.num_swapped == 0


def test_swap_pool_sized_from_swap_space() -> None:
    # llama-2-7b, block 16: 16 tokens * 2 (K,V) * 32 layers * 32 heads * 128 * 2 bytes = 8 MiB
    cfg = make_config(preemption_mode="swap", swap_space=1.0)
    s = Scheduler(cfg, make_kv(16))
    assert s.swap_pool.page_size_bytes == 8 * 2**20 and s.swap_pool.num_blocks == 128


def three_requests(policy: str) -> Scheduler:
    """x, y admitted in step 0, z in step 1; 3-token prompts; 3 usable blocks of 4 tokens."""
    s = Scheduler(make_config(block_size=4, scheduling_policy=policy), make_kv(4, block_size=4))
    s.add_request(req("x", 3, max_tokens=8, priority=0, arrival_time=0.0))
    s.add_request(req("y", 3, max_tokens=8, priority=5, arrival_time=1.0))
    assert tokens(run_step(s)[0]) == {"x": 3, "y": 3}
    s.add_request(req("z", 3, max_tokens=8, priority=1, arrival_time=2.0))
    assert tokens(run_step(s)[0]) == {"x": 1, "y": 1, "z": 3}
    return s


def test_fcfs_victim_is_the_last_admitted() -> None:
    s = three_requests("fcfs")
    out, _ = run_step(s)  # x needs a 2nd block: z goes; then y needs one: y is the last left
    assert tokens(out) == {"x": 1} and out.preempted_req_ids == ["z", "y"]
    assert tables(s)["x"] == [1, 3]


def test_priority_victim_is_the_lowest_priority() -> None:
    s = three_requests("priority")
    out, _ = run_step(s)  # x needs a block: y (priority 5) goes, not z, the last admitted
    assert tokens(out) == {"x": 1, "z": 1} and out.preempted_req_ids == ["y"]
    assert tables(s)["x"] == [1, 2]
    assert [r.request_id for r in s.waiting] == ["y"]


def test_priority_victim_scheduled_earlier_in_the_step_is_unscheduled() -> None:
    s = Scheduler(make_config(block_size=4, scheduling_policy="priority"), make_kv(4, block_size=4))
    x = req("x", 3, max_tokens=8, priority=5, arrival_time=0.0)
    s.add_request(x)
    run_step(s)
    s.add_request(req("y", 3, max_tokens=8, priority=0, arrival_time=1.0))
    assert tokens(run_step(s)[0]) == {"x": 1, "y": 3}
    assert tokens(run_step(s)[0]) == {"x": 1, "y": 1}  # x takes the last free block
    out, _ = run_step(s)  # x decodes, then y needs a block: x (priority 5) gives its back
    assert tokens(out) == {"y": 1} and out.total_num_scheduled_tokens == 1
    assert out.preempted_req_ids == ["x"] and x.num_computed_tokens == 0
    assert tables(s)["y"] == [2, 3]


@pytest.mark.parametrize("compat,expected", [("0.33", {"a": 1, "c": 1}), ("0.23", {"a": 1})])
def test_priority_self_preemption_lets_later_requests_run_in_033(compat, expected) -> None:
    """running [a (p0), b (p9), c (p1)]; b needs a block, none is free, b is the victim.

    vLLM 0.33 goes on with c (a decode that needs no block); 0.23 stops at b."""
    cfg = make_config(block_size=4, scheduling_policy="priority", vllm_compat=compat)
    s = Scheduler(cfg, make_kv(4, block_size=4))
    s.add_request(req("a", 2, max_tokens=8, priority=0, arrival_time=0.0))
    s.add_request(req("b", 3, max_tokens=8, priority=9, arrival_time=1.0))
    assert tokens(run_step(s)[0]) == {"a": 2, "b": 3}
    s.add_request(req("c", 2, max_tokens=8, priority=1, arrival_time=2.0))
    assert tokens(run_step(s)[0]) == {"a": 1, "b": 1, "c": 2}
    out, _ = run_step(s)
    assert tokens(out) == expected and out.preempted_req_ids == ["b"]


def test_no_admission_in_a_step_that_preempted() -> None:
    s = three_requests("fcfs")
    s.add_request(req("late", 1, max_tokens=1))
    out, _ = run_step(s)
    assert out.preempted_req_ids and "late" not in tokens(out)


def test_select_victim_index_ties_go_to_the_later_arrival_or_literally_to_the_first() -> None:
    rs = [
        req("a", 1, priority=2, arrival_time=1.0),
        req("b", 1, priority=2, arrival_time=1.0),
        req("c", 1, priority=1, arrival_time=9.0),
    ]
    rs[0].arrival_rank, rs[1].arrival_rank, rs[2].arrival_rank = 2, 1, 3
    assert select_victim_index(rs, "priority") == 0  # a arrived after b
    rs[0].arrival_rank = 0
    assert select_victim_index(rs, "priority") == 1
    assert select_victim_index(rs, "priority", literal=True) == 0  # vLLM's max(): the first
    assert select_victim_index(rs, "fcfs") == 2


def _tied_pair_steps(literal: bool, max_steps: int = 600) -> tuple[int, int]:
    """Two equal-priority requests that arrive together and cannot both fit: (steps run,
    requests finished). A case a hypothesis run found: with vLLM's literal tie rule each
    preempts the other one step before it is done, forever."""
    cfg = make_config(
        block_size=2,
        max_num_batched_tokens=67,
        max_num_seqs=7,
        max_model_len=128,
        enable_prefix_caching=False,
        preemption_mode="recompute",
        scheduling_policy="priority",
        vllm_compat="0.23",
        long_prefill_token_threshold=32,
        scheduler_reserve_full_isl=False,
    )
    kv = make_kv(66, block_size=2, enable_caching=False, check_invariants=False)
    s = Scheduler(cfg, kv, literal_victim_ties=literal)
    for i, (prompt_len, max_tokens) in enumerate(
        [(64, 39), (55, 11), (9, 28), (61, 9), (1, 19), (64, 39), (64, 39), (28, 11), (68, 32)]
    ):
        s.add_request(
            req(
                f"r{i}",
                [(i % 3 * 37 + j) % 1000 for j in range(prompt_len)],
                max_tokens,
                priority=i % 3,
            )
        )
    steps = 0
    while s.has_unfinished_requests() and steps < max_steps:
        run_step(s)
        steps += 1
    return steps, s.stats.num_finished


def test_tied_victims_go_to_the_later_arrival_so_the_pair_finishes() -> None:
    steps, finished = _tied_pair_steps(literal=False)
    assert finished == 9 and steps < 600
    assert _tied_pair_steps(literal=True) == (600, 1)  # the literal rule cycles


def test_self_preemption_when_the_request_itself_is_last() -> None:
    s = make_scheduler(3, block_size=4)  # 2 usable blocks
    s.add_request(req("a", 3, max_tokens=2))
    s.add_request(req("b", 4, max_tokens=2))
    assert tokens(run_step(s)[0]) == {"a": 3, "b": 4}
    out, finished = run_step(s)  # b needs a 2nd block, none is free, b is the last: b goes
    assert tokens(out) == {"a": 1} and out.preempted_req_ids == ["b"]
    assert [r.request_id for r in finished] == ["a"]
    out, _ = run_step(s)  # b's prompt block is still cached: 4 tokens hit, 1 recomputed
    assert tokens(out) == {"b": 1} and out.scheduled[0].num_prefix_hit_tokens == 4
    assert out.scheduled[0].block_ids == [2, 1]
