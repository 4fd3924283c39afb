"""Summaries of a run: `vllm bench serve`'s JSON keys and printed block, plus the KV block.

The JSON keys and the printed lines are vLLM's (`vllm/benchmarks/serve.py`), so parsers and
regexes written for `vllm bench serve` read pagesim's output unchanged. Latencies are in ms;
percentiles use numpy's default (linear) interpolation, as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pagesim.metrics.collector import MetricsCollector, RequestRecord
from pagesim.metrics.runs import run_stats

LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")
#: The throughputs and the TTFT and TPOT figures that summary tables lead with, in vllm bench's
#: order of its printed block.
HEADLINE_METRICS: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
)
METRIC_TITLES = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def _stats(name: str, values_s: np.ndarray, percentiles: Iterable[float]) -> dict[str, float]:
    ms = values_s * 1000.0 if values_s.size else np.zeros(1)
    # `ms` is this function's own copy: mean and std first (their sums depend on the order),
    # then the order statistics, which may reorder it in place (no copy of a large ITL array).
    mean, std = float(np.mean(ms)), float(np.std(ms))
    out = {
        f"mean_{name}_ms": mean,
        f"median_{name}_ms": float(np.median(ms, overwrite_input=True)),
        f"std_{name}_ms": std,
    }
    for p in percentiles:
        key = f"p{int(p)}" if float(p).is_integer() else f"p{p}"
        out[f"{key}_{name}_ms"] = float(np.percentile(ms, p, overwrite_input=True))
    return out


def request_arrays(
    records: list[RequestRecord], num_samples: Mapping[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT (output_len > 1 only), E2EL and tpot_per_request, in seconds.

    Only completed requests count; `tpot_per_request` is aligned with `ttft` (0 for a
    single-token output) for goodput.

    `num_samples` (prompt id -> samples, from `merge_samples`): a merged prompt's TPOT is per
    output position of one sample, its output tokens divided among its samples."""
    done = [r for r in records if r.reject_reason is None and r.finish_time is not None]
    arrival = np.array([r.arrival_time for r in done], dtype=np.float64)
    first = np.array([r.first_token_time for r in done], dtype=np.float64)
    finish = np.array([r.finish_time for r in done], dtype=np.float64)
    n_out = np.array([r.num_output_tokens for r in done], dtype=np.float64)
    if num_samples:
        n_out /= np.array([num_samples.get(r.request_id, 1) for r in done], dtype=np.float64)
    ttft = first - arrival
    e2el = finish - arrival
    multi = n_out > 1
    tpot_per_request = np.zeros_like(e2el)
    tpot_per_request[multi] = (e2el[multi] - ttft[multi]) / (n_out[multi] - 1)
    return {
        "ttft": ttft,
        "tpot": tpot_per_request[multi],
        "e2el": e2el,
        "tpot_per_request": tpot_per_request,
    }


def merge_samples(records: list[RequestRecord]) -> tuple[list[RequestRecord], dict[str, int]]:
    """One record per prompt, and the samples of each prompt served as several (n > 1).

    As `vllm bench throughput` counts a request of n samples: one request, its prompt tokens
    once, the output tokens of all samples. Its first token is the first of any sample (the
    first a streaming client sees), it finishes when its last sample does, and it fails if
    a sample was rejected. Records of unsampled requests pass unchanged, in order."""
    if all(r.parent_request_id is None for r in records):
        return records, {}
    groups: dict[str | int, list[RequestRecord]] = {}  # an unsampled record under its index
    for i, r in enumerate(records):
        groups.setdefault(i if r.parent_request_id is None else r.parent_request_id, []).append(r)
    merged: list[RequestRecord] = []
    for item, group in groups.items():
        if isinstance(item, int):
            merged.append(group[0])
            continue
        firsts = [r.first_token_time for r in group if r.first_token_time is not None]
        lasts = [r.last_token_time for r in group if r.last_token_time is not None]
        finishes = [r.finish_time for r in group]
        rejected = next((r.reject_reason for r in group if r.reject_reason is not None), None)
        scheduled = [r.first_scheduled_time for r in group if r.first_scheduled_time is not None]
        head = group[0]
        merged.append(
            RequestRecord(
                request_id=item,
                arrival_time=min(r.arrival_time for r in group),
                num_prompt_tokens=head.num_prompt_tokens,
                max_tokens=head.max_tokens,
                first_scheduled_time=min(scheduled) if scheduled else None,
                first_token_time=min(firsts) if firsts else None,
                last_token_time=max(lasts) if lasts else None,
                finish_time=None if None in finishes else max(f for f in finishes if f is not None),
                num_output_tokens=sum(r.num_output_tokens for r in group),
                num_cached_tokens=sum(r.num_cached_tokens for r in group),
                num_preemptions=sum(r.num_preemptions for r in group),
                reject_reason=rejected,
                session_id=head.session_id,
                cache_salt=head.cache_salt,
            )
        )
    return merged, {pid: len(g) for pid, g in groups.items() if isinstance(pid, str)}


def _peaks(records: list[RequestRecord], metrics: MetricsCollector) -> tuple[float, int]:
    """Peak output tokens/s and peak concurrent requests over 1-second buckets (vllm bench).

    As `calculate_metrics` in vllm/benchmarks/serve.py: buckets are [k, k+1) seconds after the
    earliest start of a successful request; each output token counts in the bucket of the time
    it became visible (`MetricsCollector.token_times_s`); a request counts in every bucket from
    its start's to its finish's, both included.
    """
    done = [r for r in records if r.reject_reason is None and r.finish_time is not None]
    if not done:
        return 0.0, 0
    start = min(r.arrival_time for r in done)
    n = math.ceil(max(r.finish_time for r in done) - start) + 1  # type: ignore[operator, type-var]
    # Only buckets that something happens in are kept, so a long idle run (a low rate) costs
    # nothing: the concurrency is constant between events and the token sums are per bucket.
    # +1 at each start's bucket, -1 after each finish's (truncation, as int(); both >= 0)
    arrival = np.array([r.arrival_time for r in done], dtype=np.float64)
    finish = np.array([r.finish_time for r in done], dtype=np.float64)
    where = np.concatenate(
        [(arrival - start).astype(np.int64), (finish - start).astype(np.int64) + 1]
    )
    delta = np.concatenate([np.ones(len(done), np.int64), -np.ones(len(done), np.int64)])
    order = np.argsort(where, kind="stable")
    where, level = where[order], np.cumsum(delta[order])
    last = np.append(where[1:] != where[:-1], True)  # the level after a bucket's last event
    concurrent = level[last & (where < n)]
    times = np.frombuffer(metrics.token_times_s, dtype=np.float64)
    counts = np.frombuffer(metrics.token_counts, dtype=np.int64)
    buckets = (times - start).astype(np.int64)  # truncation, as int()
    keep = (buckets >= 0) & (buckets < n)
    _, index = np.unique(buckets[keep], return_inverse=True)
    tokens = np.bincount(index, weights=counts[keep])
    return float(tokens.max(initial=0.0)), int(concurrent.max(initial=0))


def summarize(
    metrics: MetricsCollector,
    *,
    percentiles: Iterable[float] = (99,),
    goodput_slos_ms: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The `vllm bench serve` result keys for a finished run (without run metadata)."""
    records, num_samples = merge_samples(list(metrics.records.values()))
    done = [r for r in records if r.reject_reason is None and r.finish_time is not None]
    # vllm bench times the benchmark from its start (t = 0), before the first arrival's delay.
    t0 = min(0.0, min((r.arrival_time for r in records), default=0.0))
    duration = max(max((r.finish_time for r in done), default=0.0) - t0, 1e-9)  # type: ignore[operator, type-var]
    total_in = sum(r.num_prompt_tokens for r in done)
    total_out = sum(r.num_output_tokens for r in done)
    arrays = request_arrays(records, num_samples)
    peak_tok, peak_conc = _peaks(records, metrics)
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(done) / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "max_output_tokens_per_s": peak_tok,
        "max_concurrent_requests": peak_conc,
    }
    if goodput_slos_ms:
        out["request_goodput"] = _goodput(arrays, goodput_slos_ms) / duration
    percentiles = tuple(percentiles)
    for name in LATENCY_METRICS:
        if name == "itl":  # the pooled gaps, as the collector's runs (`pagesim.metrics.runs`)
            out.update(
                run_stats(
                    name,
                    np.frombuffer(metrics.itl_run_s, dtype=np.float64),
                    np.frombuffer(metrics.itl_run_counts, dtype=np.int64),
                    percentiles,
                )
            )
        else:
            out.update(_stats(name, arrays[name], percentiles))
    return out


def _goodput(arrays: dict[str, np.ndarray], slos_ms: Mapping[str, float]) -> int:
    """Requests meeting every SLO (DistServe's definition, as vllm bench's --goodput).

    TPOT of a single-token output counts as 0, as in vllm bench.
    """
    ok = np.ones(arrays["ttft"].size, dtype=bool)
    for key, limit in slos_ms.items():
        vals = arrays["tpot_per_request"] if key == "tpot" else arrays[key]
        ok &= vals * 1000.0 <= limit
    return int(ok.sum())


def format_benchmark_block(
    result: Mapping[str, Any],
    *,
    request_rate: float,
    max_concurrency: int | None,
    percentiles: Iterable[float] = (99,),
    metrics: Iterable[str] = LATENCY_METRICS,
) -> str:
    """The `Serving Benchmark Result` block, line for line as vllm bench prints it; `metrics`
    are the latency sections shown (vllm bench's --percentile-metrics)."""
    shown = set(metrics)
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    row_i = "{:<40} {:<10}"
    row_f = "{:<40} {:<10.2f}"
    lines.append(row_i.format("Successful requests:", result["completed"]))
    lines.append(row_i.format("Failed requests:", result["failed"]))
    if max_concurrency is not None:
        lines.append(row_i.format("Maximum request concurrency:", max_concurrency))
    if request_rate != float("inf"):
        lines.append(row_f.format("Request rate configured (RPS):", request_rate))
    lines.append(row_f.format("Benchmark duration (s):", result["duration"]))
    lines.append(row_i.format("Total input tokens:", result["total_input_tokens"]))
    lines.append(row_i.format("Total generated tokens:", result["total_output_tokens"]))
    lines.append(row_f.format("Request throughput (req/s):", result["request_throughput"]))
    if result.get("request_goodput") is not None:
        lines.append(row_f.format("Request goodput (req/s):", result["request_goodput"]))
    lines.append(row_f.format("Output token throughput (tok/s):", result["output_throughput"]))
    lines.append(
        row_f.format("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"])
    )
    lines.append(row_f.format("Peak concurrent requests:", result["max_concurrent_requests"]))
    lines.append(row_f.format("Total token throughput (tok/s):", result["total_token_throughput"]))
    for name in (m for m in LATENCY_METRICS if m in shown):
        title, short = METRIC_TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines.append(row_f.format(f"Mean {short} (ms):", result[f"mean_{name}_ms"]))
        lines.append(row_f.format(f"Median {short} (ms):", result[f"median_{name}_ms"]))
        for p in percentiles:
            key = f"p{int(p)}" if float(p).is_integer() else f"p{p}"
            label = f"P{int(p)}" if float(p).is_integer() else f"P{p}"
            lines.append(row_f.format(f"{label} {short} (ms):", result[f"{key}_{name}_ms"]))
    lines.append("=" * 50)
    return "\n".join(lines)


#: pagesim's numeric result keys beside vllm bench's (`engine_keys`, and the waste split that
#: the simulator adds), by how a cluster merges them over its replicas: counters add up, peaks
#: take the largest, time-weighted means and KV fractions average (replicas have equal KV
#: memory). `prefix_cache_hit_rate` is recomputed from the summed tokens, and `num_gpu_blocks`
#: is every replica's.
SUMMED_KEYS: tuple[str, ...] = (
    "num_rejected",
    "num_preemptions",
    "num_swap_preemptions",
    "preempted_computed_tokens",
    "recomputed_tokens",
    "swapped_out_bytes",
    "swapped_in_bytes",
    "num_steps",
    "busy_time_s",
    "prefix_cache_query_tokens",
    "prefix_cache_hit_tokens",
)
PEAK_KEYS: tuple[str, ...] = ("max_num_running", "kv_cache_usage_peak")
MEAN_KEYS: tuple[str, ...] = (
    "mean_num_running",
    "kv_cache_usage_mean",
    "kv_token_state_frac",
    "kv_reserved_frac",
    "kv_internal_frag_frac",
    "kv_external_frag_frac",
    "kv_free_frac",
)


def engine_keys(metrics: MetricsCollector, stats, num_gpu_blocks: int) -> dict[str, Any]:
    """pagesim's counters shared by simulated and real runs: rejections, preemption, swap,
    batch size and KV usage (time-weighted by step time), prefix cache.

    `stats` is the scheduler's `SchedulerStats`. The waste split is added by the caller that
    measures it (the simulator).
    """
    dt = metrics.step_column("step_time_s")
    running = metrics.step_column("num_reqs")
    usage = metrics.step_column("kv_usage")
    busy = float(dt.sum())
    reasons: dict[str, int] = {}
    for rec in metrics.records.values():
        if rec.reject_reason is not None:
            key = rec.reject_reason.split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
    query = stats.num_prefix_query_tokens
    return {
        "num_rejected": stats.num_rejected,
        "rejected_reasons": dict(sorted(reasons.items())),
        "num_preemptions": stats.num_preemptions,
        "num_swap_preemptions": stats.num_swap_preemptions,
        "preempted_computed_tokens": stats.preempted_computed_tokens,
        "recomputed_tokens": stats.recomputed_tokens,
        "swapped_out_bytes": stats.swapped_out_bytes,
        "swapped_in_bytes": stats.swapped_in_bytes,
        "mean_num_running": float((running * dt).sum() / busy) if busy > 0 else 0.0,
        "max_num_running": int(running.max(initial=0)),
        "num_steps": metrics.num_steps,
        "busy_time_s": busy,
        "prefix_cache_query_tokens": query,
        "prefix_cache_hit_tokens": stats.num_prefix_hit_tokens,
        "prefix_cache_hit_rate": stats.num_prefix_hit_tokens / query if query else 0.0,
        "kv_cache_usage_mean": float((usage * dt).sum() / busy) if busy > 0 else 0.0,
        "kv_cache_usage_peak": float(usage.max(initial=0.0)),
        "num_gpu_blocks": num_gpu_blocks,
    }


# What each rejection code means, as a user would fix it (codes: `scheduler.admission`).
REJECT_HINTS = {
    "prompt_too_long": "prompt > max_model_len{len}",
    "max_tokens_too_large": "prompt + max_tokens > max_model_len{len}",
    "kv_cache_too_small": "more K/V than the whole cache holds",
    "empty_prompt": "no prompt tokens",
    "invalid_max_tokens": "max_tokens < 1",
}


def rejection_line(result: Mapping[str, Any]) -> str | None:
    """One line: how many of the submitted requests were rejected and why, grouped by reason;
    None when none was. Submitted = completed + failed (a rejected request counts as failed,
    as vllm bench counts an HTTP 400)."""
    rejected = int(result.get("num_rejected", 0))
    if rejected == 0:
        return None
    submitted = int(result["completed"]) + int(result["failed"])
    reasons = result.get("rejected_reasons") or {}
    max_len = (result.get("engine_config") or {}).get("max_model_len")
    shown = "" if max_len is None else f" {max_len}"
    parts = [
        f"{n} {code}"
        + (f" ({REJECT_HINTS[code].format(len=shown)})" if code in REJECT_HINTS else "")
        for code, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return f"Rejected {rejected} of {submitted} requests, never served: " + ", ".join(parts)


def rejection_hint(result: Mapping[str, Any]) -> str | None:
    """What serves the requests rejected for their length, if any was."""
    if {"prompt_too_long", "max_tokens_too_large"} & set(result.get("rejected_reasons") or {}):
        return "A model with a longer context serves them: `pagesim models` lists each one's."
    return None
