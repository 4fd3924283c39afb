"""SLO strings: both vLLM forms, one-line errors, checks against a result."""

from __future__ import annotations

import math

import pytest

from pagesim.config import EngineConfig
from pagesim.errors import ConfigError
from pagesim.planning.slo import RESULT_KEYS, Bound, goodput_attainment, parse_slo, parse_slos
from pagesim.sim.simulate import LoadSpec, simulate


@pytest.mark.parametrize(
    "text, bound",
    [
        ("p99_ttft_ms<=500", Bound("p99_ttft_ms", "<=", 500.0)),
        (" mean_tpot_ms < 50 ", Bound("mean_tpot_ms", "<", 50.0)),
        ("p99.9_e2el_ms<=2e3", Bound("p99.9_e2el_ms", "<=", 2000.0)),
        ("output_throughput>=1000", Bound("output_throughput", ">=", 1000.0)),
        ("median_itl_ms>1", Bound("median_itl_ms", ">", 1.0)),
    ],
)
def test_bounds_parse(text: str, bound: Bound) -> None:
    assert parse_slo(text) == [bound]


def test_vllm_goodput_items_parse() -> None:
    assert parse_slo("ttft:500 tpot:50") == [("ttft", 500.0), ("tpot", 50.0)]
    spec = parse_slos(["p99_ttft_ms<=500", "e2el:3000"], attainment=0.95)
    assert spec.bounds == (Bound("p99_ttft_ms", "<=", 500.0),)
    assert spec.goodput_ms == (("e2el", 3000.0),)
    assert spec.attainment == 0.95


def test_json_mapping_form() -> None:
    spec = parse_slos({"p99_e2el_ms": "<=500", "p90_ttft_ms": 200})
    assert spec.bounds == (Bound("p99_e2el_ms", "<=", 500.0), Bound("p90_ttft_ms", "<=", 200.0))


@pytest.mark.parametrize(
    "text, words",
    [
        ("p99_ttfx_ms<=500", "unknown metric"),
        ("p99_ttft_ms<=abc", "expected KEY<=VALUE"),
        ("p100_ttft_ms<=5", "percentile"),
        ("ttft=500", "expected KEY<=VALUE"),
        ("ttft:fast", "not a number"),
        ("itl:50", "expected KEY<=VALUE"),
        ("ttft:0", "must be > 0"),
        ("", "empty"),
    ],
)
def test_bad_strings_are_one_line_errors(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_slo(text)
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_attainment_range() -> None:
    with pytest.raises(ConfigError, match="attainment"):
        parse_slos(["ttft:5"], attainment=1.5)


def test_percentiles_needed() -> None:
    spec = parse_slos(["p95_ttft_ms<=1", "p99.9_tpot_ms<=1", "mean_e2el_ms<=1"])
    assert spec.percentiles((99,)) == (95, 99, 99.9)


def test_check_reports_each_violation() -> None:
    spec = parse_slos(["p99_ttft_ms<=500", "output_throughput>=100"])
    ok, why = spec.check({"p99_ttft_ms": 400.0, "output_throughput": 200.0})
    assert ok and why == ()
    ok, why = spec.check({"p99_ttft_ms": 600.0, "output_throughput": 50.0})
    assert not ok
    assert why == ("p99_ttft_ms<=500 (got 600)", "output_throughput>=100 (got 50)")
    assert not spec.check({"output_throughput": 200.0})[0]  # a missing key never passes
    assert not spec.check({"p99_ttft_ms": math.nan, "output_throughput": 200.0})[0]


def test_goodput_attainment_from_a_real_run() -> None:
    load = LoadSpec(
        workload="random",
        num_prompts=40,
        request_rate=20.0,
        random_input_len=128,
        random_output_len=32,
        goodput_slos_ms=(("ttft", 1e9),),
    )
    result = simulate(EngineConfig.create(), load).result
    assert goodput_attainment(result) == 1.0
    strict = LoadSpec(**{**load.__dict__, "goodput_slos_ms": (("tpot", 1e-6),)})
    assert goodput_attainment(simulate(EngineConfig.create(), strict).result) == 0.0
    for key in RESULT_KEYS:  # every key an SLO may bound is in a run's result
        assert key in result, key
