"""GPUModelRunner end to end on the tiny model (CPU: Triton interpreter, fp32).

Two engines run in lockstep on the same requests: the GPU runner under one scheduler and the
simulator's cost-model runner under another. Every step must agree on the scheduling decisions
(requests, token counts, block tables), the runner's slot mapping and block table must be the
core's own functions of those decisions, the sampled tokens must be the simulator's, and the
runner's final hidden rows must equal a dense fp32 forward over each sequence's whole token
history, which holds only if every K/V was written to, and read from, the right slot (also
across prefix-cache hits and swap preemption).
"""

from __future__ import annotations

import pytest
import torch

from pagesim.config import EngineConfig
from pagesim.errors import InternalError
from pagesim.gpu.model import reference_attention_forward
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig, table_width
from pagesim.gpu.serve import make_engine
from pagesim.kvcache.block_table import build_block_table, build_slot_mapping
from pagesim.request import Request
from pagesim.sim.runner import CostModelRunner
from tests.scheduler.sched_helpers import apply_block_ids


class _ConstantCost:
    def step_time(self, batch) -> float:
        return 0.01


def _config(**kw) -> EngineConfig:
    base = dict(
        model="tiny-llama",
        gpu="h200",
        block_size=16,
        max_num_seqs=3,
        max_num_batched_tokens=48,
        max_model_len=256,
    )
    base.update(kw)
    return EngineConfig.create(**base)


def _requests(prompts: list[list[int]], max_tokens: list[int]) -> list[Request]:
    return [
        Request(f"r{i}", p, max_tokens=m)
        for i, (p, m) in enumerate(zip(prompts, max_tokens, strict=False))
    ]


def _dense_rows(model, sched) -> torch.Tensor:
    """Final hidden row of each scheduled sequence, from scratch over its whole history."""
    rows = []
    vocab, dev = model.spec.vocab_size, model.lm_head.device
    for sr in sched:
        n = sr.num_computed_tokens + sr.num_new_tokens
        ids = torch.tensor([t % vocab for t in sr.request.token_ids_slice(0, n)], device=dev)
        pos, last = torch.arange(n, device=dev), torch.tensor([n - 1], device=dev)
        past = [{} for _ in model.layers]
        rows.append(reference_attention_forward(model, ids, pos, [(0, n, 0)], past, last)[0])
    return torch.stack(rows)


def _lockstep(
    config: EngineConfig,
    num_gpu_blocks: int,
    make_requests,
    max_steps: int = 60,
    check_every: int = 1,
    graphs: bool = False,
    device: str = "cpu",
) -> dict[str, int]:
    gpu_sched = make_engine(config, num_gpu_blocks)
    sim_sched = make_engine(config, num_gpu_blocks)
    num_cpu = gpu_sched.swap_pool.num_blocks if gpu_sched.swap_pool is not None else 0
    runner = GPUModelRunner(
        config,
        num_gpu_blocks,
        RunnerConfig(
            device=device,
            dtype=torch.float32,
            seed=3,
            num_cpu_blocks=num_cpu,
            temperature=0.0,
            cuda_graphs=graphs,
            capture_graphs=False,
        ),
    )
    sim_runner = CostModelRunner(_ConstantCost(), vocab_size=config.model_spec.vocab_size)
    for a, b in zip(make_requests(), make_requests(), strict=False):
        gpu_sched.add_request(a)
        sim_sched.add_request(b)
    seen = {
        "steps": 0,
        "prefix_hits": 0,
        "preemptions": 0,
        "swaps": 0,
        "chunks": 0,
        "graph_steps": 0,
        "null_entries": 0,
    }
    tables: dict = {}  # request id -> its rows, rebuilt from the steps' block-id deltas
    for step in range(max_steps):
        if not gpu_sched.has_unfinished_requests():
            break
        out_g, out_s = gpu_sched.schedule(), sim_sched.schedule()
        got = [
            (s.request_id, s.num_new_tokens, s.num_computed_tokens, s.block_ids)
            for s in out_g.scheduled
        ]
        want = [
            (s.request_id, s.num_new_tokens, s.num_computed_tokens, s.block_ids)
            for s in out_s.scheduled
        ]
        assert got == want, f"step {step}: schedules differ"
        assert out_g.blocks_to_swap_out == out_s.blocks_to_swap_out
        assert out_g.blocks_to_swap_in == out_s.blocks_to_swap_in
        res_g, res_s = runner.execute_model(out_g), sim_runner.execute_model(out_s)
        assert res_g.sampled_token_ids == res_s.sampled_token_ids, f"step {step}: tokens"
        for rid in (*out_g.finished_req_ids, *out_g.preempted_req_ids):
            tables.pop(rid, None)
        rows = [apply_block_ids(tables, s) for s in out_g.scheduled]  # the manager's rows
        if out_g.scheduled and runner.kv_layout.is_hybrid:
            seen["null_entries"] += _check_group_tables(runner, out_g.scheduled, rows)
            seen["graph_steps"] += runner.step_records[-1].cuda_graph
        elif out_g.scheduled:
            starts = [s.num_computed_tokens for s in out_g.scheduled]
            news = [s.num_new_tokens for s in out_g.scheduled]
            if runner.step_records[-1].cuda_graph:  # the staged buffers the graph reads
                t, g = sum(news), runner.graphs
                slots, table = g.pack[2, :t], g.block_table[: len(rows)]
                width = g.width
                seen["graph_steps"] += 1
            else:
                md = runner.last_inputs.metadata
                slots, table = md.slot_mapping, md.block_table
                width = table_width(max(len(r) for r in rows))
            assert slots.tolist() == build_slot_mapping(rows, starts, news, 16)
            assert table.tolist() == build_block_table(rows, width)
        if out_g.scheduled:
            if step % check_every == 0:
                ref = _dense_rows(runner.model, out_g.scheduled)
                err = (runner.last_hidden - ref).norm() / ref.norm()
                assert err < 1e-4, f"step {step}: hidden rows differ from dense (rel {err:.2e})"
        seen["steps"] += 1
        seen["prefix_hits"] += sum(s.num_prefix_hit_tokens > 0 for s in out_g.scheduled)
        seen["preemptions"] += len(out_g.preempted_req_ids)
        seen["swaps"] += len(out_g.blocks_to_swap_in)
        seen["chunks"] += sum(
            s.num_computed_tokens + s.num_new_tokens < s.request.num_tokens for s in out_g.scheduled
        )
        fin_g = gpu_sched.update_from_output(out_g, res_g)
        fin_s = sim_sched.update_from_output(out_s, res_s)
        assert [r.request_id for r in fin_g] == [r.request_id for r in fin_s]
    assert not gpu_sched.has_unfinished_requests(), "run did not finish"
    return seen


def _check_group_tables(runner: GPUModelRunner, sched, rows) -> int:
    """Under the hybrid layout: every KV cache group's slot mapping and table, eager or in the
    graph path's staged buffers, are the core's functions of that group's rows (`rows[i][g]`).
    Returns the null entries they hold."""
    starts = [s.num_computed_tokens for s in sched]
    news = [s.num_new_tokens for s in sched]
    t, graph = sum(news), runner.step_records[-1].cuda_graph
    for g in range(runner.kv_layout.num_groups):
        group = [r[g] for r in rows]
        if graph:
            slots = runner.graphs.pack[2 + g, :t]
            table, width = runner.graphs.block_tables[g][: len(rows)], runner.graphs.width
        else:
            md = runner.last_inputs.metadata[g]
            slots, table = md.slot_mapping, md.block_table
            width = table_width(max(len(r) for r in group))
        assert slots.tolist() == build_slot_mapping(group, starts, news, 16)
        assert table.tolist() == build_block_table(group, width)
    return sum(r.count(0) for per_seq in rows for r in per_seq)


@pytest.mark.parametrize("model", ["tiny-moe", "tiny-hybrid"])
def test_moe_and_hybrid_models_in_lockstep(model: str, device: str) -> None:
    """MoE layers (padded graph-path steps: padding rows are routed too) and sliding/full layers
    through the scheduler: chunked prefills longer than the tiny-hybrid window (40), decodes
    past it; the hybrid model under the hybrid manager (one row per KV cache group, sliding
    rows nulled behind the window), both through the graph path's padded static buffers."""

    def make():
        return _requests([list(range(3, 75)), list(range(7, 52))], [5, 8])

    config = _config(model=model)
    # through the graph path's padded static buffers (every step fits the largest size)
    seen = _lockstep(config, 40, make, check_every=2, graphs=True, device=device)
    assert seen["chunks"] > 0 and seen["graph_steps"] == seen["steps"]
    if model == "tiny-hybrid":
        assert seen["null_entries"] > 0
        sched = make_engine(config, 40)
        assert type(sched.kv_cache_manager).__name__ == "HybridKVCacheManager"


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graph-buffers"])
def test_lockstep_with_prefix_hits_and_chunked_prefill(graphs: bool, device: str) -> None:
    shared = [(7 * j + 3) % 500 for j in range(40)]  # 2.5 blocks of a shared system prompt

    def make():
        return _requests(
            [shared + [11, 12, 13], list(range(100, 170)), shared + [21, 22, 23, 24, 25]], [4, 3, 5]
        )

    seen = _lockstep(_config(), 64, make, graphs=graphs, device=device)
    assert seen["prefix_hits"] >= 1  # the third request reuses the first's full blocks
    assert seen["chunks"] >= 1  # a 70-token prompt under a 48-token budget is chunked
    assert (seen["graph_steps"] > 0) == graphs


@pytest.mark.slow
@pytest.mark.parametrize("mode,graphs", [("swap", False), ("swap", True), ("recompute", True)])
def test_lockstep_through_preemption(mode: str, graphs: bool, device: str) -> None:
    """A cache too small for both requests: one is preempted and resumed. Swapped, its K/V
    must survive the round trip through the pinned CPU cache; recomputed, it comes back on
    new blocks, which the graph path's kept block-table rows must follow."""

    def make():
        return _requests([list(range(1, 30)), list(range(200, 229))], [20, 20])

    cfg = _config(preemption_mode=mode, max_num_batched_tokens=64, swap_space=0.001)
    seen = _lockstep(cfg, 6, make, check_every=3, graphs=graphs, device=device)
    assert seen["preemptions"] >= 1 and (seen["swaps"] >= 1) == (mode == "swap")
    assert (seen["graph_steps"] > 0) == graphs


def test_table_width_is_a_multiple_of_16() -> None:
    assert [table_width(n) for n in (1, 15, 16, 17, 40)] == [16, 16, 16, 32, 48]


def test_copy_on_write_copies_every_layer(device: str) -> None:
    runner = GPUModelRunner(_config(), 8, RunnerConfig(device=device, dtype=torch.float32, seed=0))
    for k, v in runner.kv_caches:
        k.normal_()
        v.normal_()
    runner._copy_blocks([(2, 5), (3, 6)])
    for k, v in runner.kv_caches:
        assert torch.equal(k[5], k[2]) and torch.equal(v[6], v[3])
        assert not torch.equal(k[4], k[2])


def test_swap_without_cpu_cache_is_an_error() -> None:
    from pagesim.scheduler.output import SchedulerOutput

    runner = GPUModelRunner(_config(), 8, RunnerConfig(device="cpu", dtype=torch.float32))
    with pytest.raises(InternalError, match="no CPU cache"):
        runner.execute_model(SchedulerOutput(step_id=0, blocks_to_swap_out=[(1, 0)]))
