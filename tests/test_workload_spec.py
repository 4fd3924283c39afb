"""Spec parsing and `load_workload` arguments: every bad input is one `WorkloadError` line
naming the field and value; unknown names list the shipped ones."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pagesim.errors import PagesimError, UnknownNameError, WorkloadError
from pagesim.workload import load_workload, shipped_workloads

SHIPPED = [
    "arxiv",
    "bwb",
    "chat",
    "chat-8k",
    "code",
    "conversation",
    "mix",
    "mooncake-conversation",
    "mooncake-synthetic",
    "multi-turn",
    "random",
    "rollout",
    "system-prompt",
]
LENGTHS_CSV = "num_prefill_tokens,num_decode_tokens\n100,10\n200,20\n300,30\n"


def _spec(tmp_path: Path, text: str, name: str = "w.yaml") -> str:
    (tmp_path / "lengths.csv").write_text(LENGTHS_CSV)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_names() -> None:
    assert shipped_workloads() == SHIPPED


def test_unknown_name_lists_shipped() -> None:
    with pytest.raises(UnknownNameError) as e:
        load_workload("chatt")
    msg = str(e.value)
    assert "'chatt'" in msg and all(name in msg for name in SHIPPED) and "\n" not in msg


BAD_SPECS = {
    "malformed_yaml": ("lengths: {trace: [unclosed\n", "malformed YAML at line"),
    "not_mapping": ("- 1\n- 2\n", "w.yaml': top level = [1, 2]: expected a mapping"),
    "empty": ("", "w.yaml': the file is empty"),
    "comments_only": ("# name: x\n", "w.yaml': the file is empty"),
    "unknown_key": ("lengths: {trace: lengths.csv}\nrate: 3\n", "rate: unknown key"),
    "no_source": ("name: x\n", "needs exactly one of trace, lengths, mix"),
    "two_sources": ("lengths: {trace: lengths.csv}\ntrace: lengths.csv\n", "exactly one"),
    "bad_rate": (
        "lengths: {trace: lengths.csv}\narrival: {process: poisson, rate: -2}\n",
        "arrival.rate = -2.0",
    ),
    "bad_process": (
        "lengths: {trace: lengths.csv}\narrival: {process: weibull}\n",
        "arrival.process = 'weibull'",
    ),
    "trace_arrival_untimed": (
        "lengths: {trace: lengths.csv}\narrival: {process: trace}\n",
        "no trace timestamps",
    ),
    "poisson_burstiness": (
        "lengths: {trace: lengths.csv}\narrival: {process: poisson, rate: 1, burstiness: 2}\n",
        "arrival.burstiness = 2.0",
    ),
    "dist_kind": ("lengths: {input: {dist: cauchy}, output: 5}\n", "lengths.input.dist = 'cauchy'"),
    "dist_param": (
        "lengths: {input: {dist: normal, mean: 5}, output: 5}\n",
        "lengths.input.std: missing",
    ),
    "dist_negative": ("lengths: {input: -3, output: 5}\n", "lengths.input.value = -3.0"),
    "dist_extra": (
        "lengths: {input: {dist: fixed, value: 3, sigma: 1}, output: 5}\n",
        "lengths.input.sigma: unknown key",
    ),
    "missing_output": ("lengths: {input: 5}\n", "lengths.output: missing"),
    "prefix_groups": (
        "lengths: {input: 5, output: 5}\nprefix: {groups: 0, length: 5}\n",
        "prefix.groups = 0",
    ),
    "prefix_on_trace": (
        "trace: lengths.csv\nprefix: {groups: 1, length: 5}\n",
        "prefix: needs a `lengths` source",
    ),
    "sessions_missing": (
        "lengths: {input: 5, output: 5}\nsessions: {turns: 3}\n",
        "sessions.think_time_s: missing",
    ),
    "tenants": ("lengths: {input: 5, output: 5}\ntenants: {count: 1.5}\n", "tenants.count = 1.5"),
    "missing_trace": ("lengths: {trace: nowhere.csv}\n", "not found"),
    "range_ratio": ("lengths: {random: {range_ratio: 1.0}}\n", "random_range_ratio = 1.0"),
    "mix_empty": ("mix: []\n", "expected a non-empty list"),
    "mix_weight": ("mix: [{workload: chat, weight: 0}]\n", "mix[0].weight = 0"),
    "mix_unknown": ("mix: [{workload: nosuch}]\n", "unknown workload 'nosuch'"),
    "mix_some_weights": (
        "mix: [{workload: chat, weight: 0.7}, {workload: code}]\n",
        "no weight for mix[1]; give every component a weight, or none",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_raises_one_line(tmp_path: Path, case: str) -> None:
    text, needle = BAD_SPECS[case]
    with pytest.raises(PagesimError) as e:
        load_workload(_spec(tmp_path, text))
    assert needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_mix_cycle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("mix: [{workload: a.yaml}]\n")
    path = _spec(tmp_path, "mix: [{workload: b.yaml}]\n", name="a.yaml")
    with pytest.raises(WorkloadError, match="mix refers to itself"):
        load_workload(path)


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"random_range_ratio": 1.0}, "random_range_ratio = 1.0"),
        ({"random_range_ratio": -0.1}, "random_range_ratio = -0.1"),
        ({"random_input_len": -1}, "random_input_len = -1"),
        ({"random_output_len": 0}, "random_output_len = 0"),
        ({"random_input_len": 0}, "could have 0 tokens"),
        ({"request_rate": 2.0}, "unknown workload parameter 'request_rate'"),
    ],
)
def test_bad_random_params(params: dict, needle: str) -> None:
    with pytest.raises(WorkloadError) as e:
        load_workload("random", **params)
    assert needle in str(e.value)


def test_random_params_only_for_random_and_none_means_unset() -> None:
    with pytest.raises(WorkloadError, match="random_input_len = 512: workload 'chat'"):
        load_workload("chat", random_input_len=512)
    load_workload("chat", random_input_len=None, time_scale=None)  # None: not given
    with pytest.raises(WorkloadError, match="time_scale = 2.0: workload 'chat'"):
        load_workload("chat", time_scale=2.0)


@pytest.mark.parametrize("n", [0, -5, 2.5, True])
def test_bad_num_prompts(n: object) -> None:
    with pytest.raises(WorkloadError, match="num_prompts"):
        load_workload("random").sample(n)  # type: ignore[arg-type]


def test_random_lengths_mirror_vllm_bench() -> None:
    """Uniform integers in [floor(L(1-r)), ceil(L(1+r))], output >= 1, drawn input then
    output from default_rng(seed), as vLLM's RandomDataset.get_sampling_params."""
    plan = load_workload(
        "random",
        random_input_len=100,
        random_output_len=1,
        random_range_ratio=0.5,
        random_prefix_len=7,
    ).sample(4000, seed=3)
    rng = np.random.default_rng(3)
    inputs = rng.integers(50, 151, size=4000)
    outputs = rng.integers(1, 3, size=4000)  # floor(0.5) = 0 -> raised to 1, ceil(1.5) = 2
    assert np.array_equal(plan.prompt_lens, inputs + 7)
    assert np.array_equal(plan.output_lens, outputs)
    assert plan.prompt_lens.min() == 57 and plan.prompt_lens.max() == 157
    # The 7-token prefix is shared by every prompt; the next token is each prompt's own.
    a, b = plan.materialize(0), plan.materialize(1)
    assert a[:7] == b[:7] and a[7] != b[7]
    defaults = load_workload("random").sample(10, seed=0)
    assert set(defaults.prompt_lens.tolist()) == {1024}
    assert set(defaults.output_lens.tolist()) == {128}


def test_length_trace_sampling_rule(tmp_path: Path) -> None:
    """vllm bench: a seeded shuffle of the rows, then extra rows drawn with replacement."""
    w = load_workload(_spec(tmp_path, "lengths: {trace: lengths.csv}\n"))
    plan = w.sample(10, seed=1)
    assert sorted(plan.prompt_lens[:3].tolist()) == [100, 200, 300]  # each row once first
    assert set(plan.prompt_lens.tolist()) <= {100, 200, 300}
    assert np.array_equal(plan.output_lens * 10, plan.prompt_lens)  # pairs kept jointly
    assert plan.arrival.process == "inf"


def test_spec_arrival_and_dists(tmp_path: Path) -> None:
    text = (
        "name: custom\nlengths:\n  input: {dist: uniform, low: 10, high: 20}\n"
        "  output: {dist: lognormal, mean: 50, std: 10, max: 60}\n"
        "arrival: {process: gamma, rate: .inf, burstiness: 0.5}\n"
    )
    w = load_workload(_spec(tmp_path, text))
    plan = w.sample(500, seed=0)
    assert w.name == "custom" and plan.arrival.process == "gamma"
    assert math.isinf(plan.arrival.rate)
    assert plan.prompt_lens.min() >= 10 and plan.prompt_lens.max() <= 20
    assert plan.output_lens.max() <= 60 and 40 < plan.output_lens.mean() < 55


def test_max_total_tokens_filters_trace_rows(tmp_path) -> None:
    (tmp_path / "l.csv").write_text(LENGTHS_CSV)
    (tmp_path / "w.yaml").write_text("lengths: {trace: l.csv, max_total_tokens: 220}\n")
    plan = load_workload(str(tmp_path / "w.yaml")).sample(num_prompts=50, seed=1)
    assert set((plan.prompt_lens + plan.output_lens).tolist()) == {110, 220}


def test_max_total_tokens_that_keeps_nothing_is_an_error(tmp_path) -> None:
    (tmp_path / "l.csv").write_text(LENGTHS_CSV)
    (tmp_path / "w.yaml").write_text("lengths: {trace: l.csv, max_total_tokens: 5}\n")
    with pytest.raises(WorkloadError, match="max_total_tokens=5"):
        load_workload(str(tmp_path / "w.yaml"))
