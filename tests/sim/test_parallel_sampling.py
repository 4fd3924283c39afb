"""Parallel sampling (`n > 1`): a prompt served as n child requests that share its prefix
blocks through the prefix cache (vLLM v1's fan-out), with `vllm bench throughput`'s counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.config import EngineConfig
from pagesim.errors import PagesimError
from pagesim.metrics import MetricsCollector, summarize
from pagesim.metrics.report import merge_samples
from pagesim.request import Request
from pagesim.sim.simulate import LoadSpec, simulate
from pagesim.workload import load_workload

SPEC = """name: sampled
n: 4
lengths:
  input: {dist: uniform, low: 100, high: 300}
  output: {dist: uniform, low: 20, high: 60}
"""


def _spec(tmp_path: Path, text: str = SPEC) -> str:
    path = tmp_path / "w.yaml"
    path.write_text(text)
    return str(path)


def test_samples_are_named_as_vllm_names_child_requests(tmp_path: Path) -> None:
    plan = load_workload(_spec(tmp_path)).sample(3, seed=1)
    assert plan.n == 4
    parent = plan.session(1).first_request(2.0)
    samples = plan.samples(parent)
    assert [s.request_id for s in samples] == ["0_1", "1_1", "2_1", "3_1"]
    for s in samples:
        assert s.prompt_token_ids == parent.prompt_token_ids
        assert s.prompt_token_ids is not parent.prompt_token_ids
        assert (s.max_tokens, s.arrival_time, s.parent_request_id) == (parent.max_tokens, 2.0, "1")


def test_samples_share_the_prompt_blocks_and_count_as_vllm_bench_throughput(
    tmp_path: Path,
) -> None:
    plan = load_workload(_spec(tmp_path)).sample(6, seed=3)
    sim = simulate(
        EngineConfig.create(num_gpu_blocks_override=2000),
        LoadSpec(workload=_spec(tmp_path), num_prompts=6, seed=3, request_rate=float("inf")),
        check_invariants=True,
    )
    res, records = sim.result, sim.metrics.records
    assert len(records) == 24 and res["completed"] == 6 and res["failed"] == 0
    assert res["total_input_tokens"] == int(plan.prompt_lens.sum())  # each prompt once
    assert res["total_output_tokens"] == 4 * int(plan.output_lens.sum())  # every sample
    for i, prompt_len in enumerate(plan.prompt_lens.tolist()):
        # sample 0 cached the prompt's full blocks when it was allocated, in its first step;
        # the others hit them, the last prompt token recomputed (whole blocks)
        hits = [records[f"{k}_{i}"].num_cached_tokens for k in range(4)]
        assert hits == [0] + [(prompt_len - 1) // 16 * 16] * 3


def test_a_concurrency_slot_holds_all_samples_of_a_prompt(tmp_path: Path) -> None:
    sim = simulate(
        EngineConfig.create(),
        LoadSpec(workload=_spec(tmp_path), num_prompts=6, max_concurrency=2, seed=0),
    )
    assert sim.result["completed"] == 6
    assert sim.result["max_num_running"] == 8  # 2 prompts x 4 samples


def test_merged_prompt_times() -> None:
    """TTFT from the first sample's first token, E2EL at the last sample's end, TPOT per output
    position of one sample."""
    m = MetricsCollector()
    for k, tokens in enumerate(([1.0, 2.0, 3.0], [1.5, 2.5, 4.0])):
        r = Request(f"{k}_p", list(range(10)), 3, parent_request_id="p")
        m.on_arrival(r, 0.0)
        m.on_first_scheduled(r, 0.5)
        for t in tokens:
            m.on_token(m.records[r.request_id], t)
        m.on_finish(r, tokens[-1])
    (prompt,), samples = merge_samples(list(m.records.values()))
    assert samples == {"p": 2}
    assert (prompt.first_token_time, prompt.finish_time, prompt.num_output_tokens) == (1.0, 4.0, 6)
    res = summarize(m)
    assert res["completed"] == 1 and res["total_input_tokens"] == 10
    assert res["mean_ttft_ms"] == pytest.approx(1000.0)
    assert res["mean_e2el_ms"] == pytest.approx(4000.0)
    assert res["mean_tpot_ms"] == pytest.approx((4.0 - 1.0) / 2 * 1000.0)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("n: 0\nlengths: {input: 5, output: 5}\n", "n = 0"),
        ("n: 2.5\nlengths: {input: 5, output: 5}\n", "n = 2.5"),
        (
            "n: 2\nlengths: {input: 5, output: 5}\nsessions: {turns: 3, think_time_s: 1}\n",
            "n = 2: parallel sampling of multi-turn sessions",
        ),
    ],
)
def test_bad_n_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(PagesimError) as e:
        load_workload(_spec(tmp_path, text))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_shipped_rollout_workload() -> None:
    plan = load_workload("rollout").sample(64, seed=0)
    assert 8 <= plan.n <= 16
    assert (plan.prompt_lens + plan.output_lens).max() <= 4096
    assert plan.output_lens.mean() > 2 * plan.prompt_lens.mean()  # long outputs
