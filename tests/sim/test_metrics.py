"""Run metrics against hand-computed values, with `vllm bench serve`'s definitions.

vllm bench (vllm/benchmarks/serve.py, `calculate_metrics`), per successful request:
TTFT = first token - start; TPOT = (E2E - TTFT) / (n - 1), only for n > 1 (0 for goodput);
ITL = every gap between consecutive tokens, pooled; E2E = finish - start; statistics with
numpy (mean, median, population std, linear percentiles); the duration runs from the start of
the benchmark; goodput counts requests meeting every SLO (value <= SLO); peak output tok/s and
peak concurrency use 1-second buckets counted from the earliest successful start, each token at
its own time, each request in every bucket from its start's to its end's.
"""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.metrics import MetricsCollector, format_benchmark_block, summarize
from pagesim.request import Request


class Script:
    """Feed a collector the events of hand-written requests, in time order."""

    def __init__(self) -> None:
        self.m = MetricsCollector()
        self.events: list[tuple[float, int, str, object]] = []
        self.requests: dict[str, Request] = {}

    def request(self, rid: str, arrival: float, prompt_len: int, token_times: list[float]) -> None:
        r = Request(rid, list(range(prompt_len)), max_tokens=max(1, len(token_times)))
        self.requests[rid] = r
        self.events.append((arrival, 0, "arrive", r))
        self.events.append((arrival, 1, "scheduled", r))
        for tt in token_times:
            self.events.append((tt, 2, "token", r))
        self.events.append((token_times[-1], 3, "finish", r))

    def rejected(self, rid: str, at: float, prompt_len: int = 5) -> None:
        r = Request(rid, list(range(prompt_len)), max_tokens=1)
        r.reject_reason = "prompt_too_long: test"
        self.events.append((at, 0, "arrive", r))
        self.events.append((at, 1, "reject", r))

    def collect(self) -> MetricsCollector:
        for now, _, kind, r in sorted(self.events, key=lambda e: (e[0], e[1])):
            if kind == "arrive":
                self.m.on_arrival(r, now)
            elif kind == "scheduled":
                self.m.on_first_scheduled(r, now)
            elif kind == "token":
                self.m.on_token(self.m.records[r.request_id], now)
            elif kind == "finish":
                self.m.on_finish(r, now)
            else:
                self.m.on_reject(r, now)
        return self.m


def three_requests() -> MetricsCollector:
    """r1: start 0, tokens 0.5 0.7 1.0; r2: start 0.2, one token 0.9;
    r3: start 1.5, tokens 2.0 2.1 2.6 3.2; r4: rejected at 0.3."""
    s = Script()
    s.request("r1", 0.0, 100, [0.5, 0.7, 1.0])
    s.request("r2", 0.2, 50, [0.9])
    s.request("r3", 1.5, 10, [2.0, 2.1, 2.6, 3.2])
    s.rejected("r4", 0.3)
    return s.collect()


TTFT = np.array([0.5, 0.7, 0.5])
TPOT = np.array([0.5 / 2, 1.2 / 3])  # r2 has one token: no TPOT
ITL = np.array([0.2, 0.3, 0.1, 0.5, 0.6])
E2EL = np.array([1.0, 0.7, 1.7])


def test_counts_and_throughputs() -> None:
    s = summarize(three_requests())
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["total_input_tokens"] == 160 and s["total_output_tokens"] == 8
    assert s["duration"] == pytest.approx(3.2)
    assert s["request_throughput"] == pytest.approx(3 / 3.2)
    assert s["output_throughput"] == pytest.approx(8 / 3.2)
    assert s["total_token_throughput"] == pytest.approx(168 / 3.2)
    assert s["request_goodput"] is None  # no --goodput: null, as vllm bench writes


@pytest.mark.parametrize(
    ("name", "values"), [("ttft", TTFT), ("tpot", TPOT), ("itl", ITL), ("e2el", E2EL)]
)
def test_latency_statistics_are_numpys_in_ms(name: str, values: np.ndarray) -> None:
    s = summarize(three_requests(), percentiles=(50, 90, 99.9))
    ms = values * 1000
    assert s[f"mean_{name}_ms"] == pytest.approx(np.mean(ms), rel=1e-9)
    assert s[f"median_{name}_ms"] == pytest.approx(np.median(ms), rel=1e-9)
    assert s[f"std_{name}_ms"] == pytest.approx(np.std(ms), rel=1e-9)
    for p, key in ((50, "p50"), (90, "p90"), (99.9, "p99.9")):
        assert s[f"{key}_{name}_ms"] == pytest.approx(np.percentile(ms, p), rel=1e-9)


def test_tpot_only_counts_multi_token_outputs() -> None:
    """Single-token outputs have no TPOT at all (not a 0 that drags the mean down)."""
    s = Script()
    s.request("one", 0.0, 4, [0.4])
    s.request("two", 0.0, 4, [0.4, 0.6])
    out = summarize(s.collect())
    assert out["mean_tpot_ms"] == pytest.approx(200.0)
    assert out["median_tpot_ms"] == pytest.approx(200.0)
    assert out["mean_itl_ms"] == pytest.approx(200.0)


def test_nothing_completed_gives_zeros_not_nans() -> None:
    s = Script()
    s.rejected("x", 0.0)
    out = summarize(s.collect())
    assert out["completed"] == 0 and out["failed"] == 1
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert out[f"mean_{name}_ms"] == 0.0 and out[f"p99_{name}_ms"] == 0.0


def test_duration_runs_from_the_start_of_the_benchmark() -> None:
    """vllm bench times the whole benchmark: a first arrival at 2 s still counts from 0."""
    s = Script()
    s.request("a", 2.0, 4, [2.5, 3.0])
    out = summarize(s.collect())
    assert out["duration"] == pytest.approx(3.0)
    assert out["request_throughput"] == pytest.approx(1 / 3.0)


@pytest.mark.parametrize(
    ("slos", "good"),
    [
        ({"ttft": 600}, 2),  # r2's 700 ms fails
        ({"ttft": 600, "tpot": 300}, 1),  # r3's TPOT 400 ms fails too
        ({"tpot": 1}, 1),  # r2's single token counts as TPOT 0 and passes
        ({"e2el": 1000}, 2),  # r1 exactly at the SLO passes (value <= SLO)
        ({"ttft": 100}, 0),
    ],
)
def test_goodput(slos: dict[str, float], good: int) -> None:
    out = summarize(three_requests(), goodput_slos_ms=slos)
    assert out["request_goodput"] == pytest.approx(good / 3.2)


def test_peak_output_tokens_counts_each_token_in_its_own_second() -> None:
    """Nine tokens in the first second and one in the second: the peak is 9, not 10 / 2."""
    s = Script()
    s.request("a", 0.0, 4, [0.1 * k for k in range(1, 10)] + [1.9])
    out = summarize(s.collect())
    assert out["max_output_tokens_per_s"] == 9.0


def test_peaks_bucket_from_the_earliest_start() -> None:
    """Buckets are [0.6, 1.6), [1.6, 2.6), ... here, not whole seconds of the clock.

    a: 0.6 -> 0.9 (token at 0.9); b: 1.2 -> 1.3 (token at 1.3): both in the first bucket.
    """
    s = Script()
    s.request("a", 0.6, 4, [0.9])
    s.request("b", 1.2, 4, [1.3])
    out = summarize(s.collect())
    assert out["max_output_tokens_per_s"] == 2.0
    assert out["max_concurrent_requests"] == 2


def test_peak_concurrency_counts_every_bucket_a_request_touches() -> None:
    """a spans buckets 0-2, b 1-2, c 2, d 4: the peak is 3 (bucket 2)."""
    s = Script()
    s.request("a", 0.0, 4, [2.2])
    s.request("b", 1.1, 4, [1.4, 2.4])
    s.request("c", 2.5, 4, [2.9])
    s.request("d", 4.0, 4, [4.5])
    s.rejected("r", 2.5)  # failed requests are not counted
    out = summarize(s.collect())
    assert out["max_concurrent_requests"] == 3
    assert out["max_output_tokens_per_s"] == 3.0  # a, b's second and c in bucket 2


EXAMPLE_BLOCK = """\
============ Serving Benchmark Result ============
Successful requests:                     1000
Failed requests:                         0
Maximum request concurrency:             25
Request rate configured (RPS):           1.50
Benchmark duration (s):                  56.78
Total input tokens:                      215196
Total generated tokens:                  198343
Request throughput (req/s):              17.61
Request goodput (req/s):                 15.02
Output token throughput (tok/s):         3493.28
Peak output token throughput (tok/s):    4100.00
Peak concurrent requests:                512.00
Total token throughput (tok/s):          7283.53
---------------Time to First Token----------------
Mean TTFT (ms):                          2456.23
Median TTFT (ms):                        2345.67
P99 TTFT (ms):                           5678.90
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          45.67
Median TPOT (ms):                        43.21
P99 TPOT (ms):                           89.01
---------------Inter-token Latency----------------
Mean ITL (ms):                           43.12
Median ITL (ms):                         40.00
P99 ITL (ms):                            120.55
----------------End-to-end Latency----------------
Mean E2EL (ms):                          12345.68
Median E2EL (ms):                        11111.00
P99 E2EL (ms):                           99999.99
=================================================="""


def example_result(goodput: float | None = 15.02) -> dict:
    return {
        "completed": 1000,
        "failed": 0,
        "duration": 56.7801,
        "total_input_tokens": 215196,
        "total_output_tokens": 198343,
        "request_throughput": 17.6124,
        "request_goodput": goodput,
        "output_throughput": 3493.2789,
        "max_output_tokens_per_s": 4100.0,
        "max_concurrent_requests": 512,
        "total_token_throughput": 7283.5317,
        "mean_ttft_ms": 2456.2299,
        "median_ttft_ms": 2345.67,
        "p99_ttft_ms": 5678.9,
        "mean_tpot_ms": 45.67,
        "median_tpot_ms": 43.2149,
        "p99_tpot_ms": 89.01,
        "mean_itl_ms": 43.12,
        "median_itl_ms": 40.0,
        "p99_itl_ms": 120.5501,
        "mean_e2el_ms": 12345.678,
        "median_e2el_ms": 11111.0,
        "p99_e2el_ms": 99999.99,
        "p90_ttft_ms": 5000.0,
        "p90_tpot_ms": 80.0,
        "p90_itl_ms": 100.0,
        "p90_e2el_ms": 9e4,
    }


def test_block_matches_vllm_bench_line_for_line() -> None:
    block = format_benchmark_block(example_result(), request_rate=1.5, max_concurrency=25)
    assert [line.rstrip() for line in block.splitlines()] == EXAMPLE_BLOCK.splitlines()
    for line in block.splitlines():
        if line[0] in "=-":
            assert len(line) == 50, line  # centred headers, 50 wide
        else:  # "{:<40} {:<10}": label padded to 40, one space, value padded to 10
            assert len(line) == 51 and line[40] == " " and line[:40].rstrip().endswith(":")


def test_block_optional_lines_and_percentiles() -> None:
    """No concurrency, rate or goodput lines for inf rate, no cap and no --goodput; one line
    per requested percentile, labelled P{int} or P{float}."""
    block = format_benchmark_block(
        example_result(goodput=None),
        request_rate=float("inf"),
        max_concurrency=None,
        percentiles=(90, 99),
    )
    text = block.splitlines()
    assert not any(
        line.startswith(
            ("Maximum request concurrency", "Request rate configured", "Request goodput")
        )
        for line in text
    )
    assert "P90 TTFT (ms):                           5000.00   " in text
    assert "P99 E2EL (ms):                           99999.99  " in text
    assert len(text) == len(EXAMPLE_BLOCK.splitlines()) - 3 + 4


def test_steps_spill_to_disk_and_read_back_in_order():
    """Past SPILL_STEPS steps the rows go to a temporary file; the columns read back are the
    same as if every row had stayed in memory, also after merging two collectors."""
    from pagesim.metrics.collector import SPILL_STEPS, STEP_COLUMNS, StepMetricsRow
    from pagesim.sim.cluster import merge_metrics

    def fill(m: MetricsCollector, n: int, base: float) -> list[StepMetricsRow]:
        rows = []
        for i in range(n):
            kv = (i / n, 0.1, 0.2, 0.3, 0.4)
            row = StepMetricsRow(
                base + i * 0.5, 0.01 * i, i % 7, i, i % 3, i % 5, 9, 2, *kv, i % 2, 4 * i
            )
            m.on_step(row)
            rows.append(row)
        return rows

    a, b = MetricsCollector(), MetricsCollector()
    rows = fill(a, 2 * SPILL_STEPS + 17, 0.0) + fill(b, SPILL_STEPS + 3, 1e6)
    assert a.step_spill.num_steps == 2 * SPILL_STEPS and len(a.step_values) == 17 * 15
    assert a.step(SPILL_STEPS + 1) == rows[SPILL_STEPS + 1]
    merged = merge_metrics([a, b])
    assert merged.num_steps == len(rows)
    for j, name in enumerate(STEP_COLUMNS):
        assert merged.step_column(name).tolist() == [float(r[j]) for r in rows]


def test_a_step_record_counts_decodes_prefill_tokens_and_lead_decodes():
    from pagesim.metrics.collector import StepMetricsRow
    from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput

    r = [Request(f"r{i}", [1] * 40, 8) for i in range(4)]
    entries = [(1, 20), (1, 0), (12, 8), (1, 33)]  # decode, a 1-token prompt, a chunk, decode
    out = SchedulerOutput(
        3,
        [ScheduledRequest(q, n, c, None) for q, (n, c) in zip(r, entries, strict=True)],
        15,
        preempted_req_ids=["x"],
        swap_bytes=64,
    )
    kv = (0.5, 0.1, 0.2, 0.3, 0.4)
    assert StepMetricsRow.of_step(1.0, 0.02, out, (6, 2), kv, num_bulk=10) == StepMetricsRow(
        1.0, 0.02, 14, 25, 13, 12, 6, 2, *kv, 1, 64
    )
    assert StepMetricsRow.of_step(2.0, 0.01, None, (10, 0), kv, num_bulk=10) == StepMetricsRow(
        2.0, 0.01, 10, 10, 0, 10, 10, 0, *kv, 0, 0
    )
