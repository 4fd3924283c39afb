"""Writing a run: the result JSON (vllm bench's keys) and per-request / per-step Parquet.

Files are deterministic: the same run writes the same bytes (the JSON's `date` aside), so
columns come from the collector in a fixed order and no pandas index metadata is written.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pagesim.metrics import STEP_COLUMNS, MetricsCollector
from pagesim.utils import atomic_output, atomic_write_bytes

REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_time",
    "num_prompt_tokens",
    "max_tokens",
    "num_output_tokens",
    "first_scheduled_time",
    "first_token_time",
    "last_token_time",
    "finish_time",
    "num_cached_tokens",
    "num_preemptions",
    "reject_reason",
    "session_id",
    "cache_salt",
)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def result_json(
    result: dict[str, Any], metadata: dict[str, Any], *, date: str | None = None
) -> str:
    """The JSON text: `date`, metadata, then the metrics, as vllm bench orders them."""
    doc = {"date": date or datetime.now().strftime("%Y%m%d-%H%M%S")}
    doc.update(metadata)
    doc.update(result)
    return json.dumps(_jsonable(doc), indent=2, allow_nan=False) + "\n"


def default_result_filename(
    metadata: dict[str, Any], date: str, *, arrival: str | None = None
) -> str:
    """vllm bench's default: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json.

    `arrival` names what timed the requests when it is not `--request-rate` (`trace` for a
    trace's own timestamps, `4qps` for a spec's Poisson process); without it, the rate.
    """
    rate = metadata.get("request_rate")
    rate_s = arrival or ("infqps" if rate in (None, "inf") else f"{rate:g}qps")
    conc = metadata.get("max_concurrency")
    conc_s = f"-concurrency{conc}" if conc else ""
    return f"pagesim-{rate_s}{conc_s}-{metadata['model_id']}-{date}.json"


def requests_table(metrics: MetricsCollector) -> pa.Table:
    recs = list(metrics.records.values())
    cols = {name: [getattr(r, name) for r in recs] for name in REQUEST_COLUMNS}
    return pa.table(cols)


def steps_table(metrics: MetricsCollector) -> pa.Table:
    steps = metrics.steps
    return pa.table({name: np.frombuffer(steps[name], dtype=np.float64) for name in STEP_COLUMNS})


# pyarrow's default row-group size: streamed row groups of this many rows give the same file
# as one `write_table` of the whole table.
PARQUET_ROW_GROUP_ROWS = 1024 * 1024


def write_parquet(metrics: MetricsCollector, directory: Path, stem: str) -> list[Path]:
    """`<stem>.requests.parquet` and `<stem>.steps.parquet` in `directory`. The steps are
    streamed a row group at a time, so a run of millions of steps never holds them all."""
    directory.mkdir(parents=True, exist_ok=True)
    requests_path = directory / f"{stem}.requests.parquet"
    steps_path = directory / f"{stem}.steps.parquet"
    write_parquet_atomic(requests_table(metrics), requests_path)
    write_steps_parquet(metrics, steps_path)
    return [requests_path, steps_path]


def write_steps_parquet(metrics: MetricsCollector, path: Path) -> None:
    """`steps_table(metrics)` as Parquet, read from the collector a chunk at a time and written
    a row group at a time (the same bytes as one `write_parquet_atomic` of the whole table)."""
    schema = pa.schema([(name, pa.float64()) for name in STEP_COLUMNS])
    with atomic_output(path) as tmp:
        with pq.ParquetWriter(tmp, schema, **_PARQUET_OPTIONS) as writer:
            pending: list[np.ndarray] = []
            num_pending = 0
            for table in metrics.step_tables():
                while len(table):
                    take = min(len(table), PARQUET_ROW_GROUP_ROWS - num_pending)
                    pending.append(table[:take])
                    num_pending += take
                    table = table[take:]
                    if num_pending == PARQUET_ROW_GROUP_ROWS:
                        writer.write_table(_step_rows(schema, pending))
                        pending, num_pending = [], 0
            if num_pending or not metrics.num_steps:  # the last row group, or an empty file
                writer.write_table(_step_rows(schema, pending))


def _step_rows(schema: pa.Schema, parts: list[np.ndarray]) -> pa.Table:
    rows = np.concatenate(parts) if parts else np.empty((0, len(STEP_COLUMNS)))
    return pa.table({name: rows[:, i].copy() for i, name in enumerate(STEP_COLUMNS)}, schema=schema)


_PARQUET_OPTIONS: dict[str, Any] = {"compression": "zstd", "write_statistics": False}


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """One Parquet file (zstd, no statistics), written whole or not at all (a temporary file
    in the same folder, then a rename)."""
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf, **_PARQUET_OPTIONS)
    atomic_write_bytes(path, buf.getvalue().to_pybytes())


def format_kv_block(result: dict[str, Any]) -> str:
    """pagesim's KV-cache block, printed after the `Serving Benchmark Result` block."""
    row_i, row_f = "{:<40} {:<10}", "{:<40} {:<10.2f}"
    pct = lambda key: 100.0 * float(result.get(key, 0.0))  # noqa: E731
    lines = ["{s:{c}^{n}}".format(s=" KV Cache Result ", n=50, c="=")]
    lines.append(row_i.format("GPU KV cache blocks:", result["num_gpu_blocks"]))
    lines.append(row_f.format("KV cache usage, mean (%):", pct("kv_cache_usage_mean")))
    lines.append(row_f.format("KV cache usage, peak (%):", pct("kv_cache_usage_peak")))
    lines.append("{s:{c}^{n}}".format(s="KV memory, time-weighted (%)", n=50, c="-"))
    lines.append(row_f.format("Token states:", pct("kv_token_state_frac")))
    lines.append(row_f.format("Reserved:", pct("kv_reserved_frac")))
    lines.append(row_f.format("Internal fragmentation:", pct("kv_internal_frag_frac")))
    lines.append(row_f.format("External fragmentation and others:", pct("kv_external_frag_frac")))
    lines.append(row_f.format("Free:", pct("kv_free_frac")))
    lines.append("{s:{c}^{n}}".format(s="Prefix cache and preemption", n=50, c="-"))
    lines.append(row_f.format("Prefix cache hit rate (%):", pct("prefix_cache_hit_rate")))
    lines.append(row_i.format("Prefix cache hit tokens:", result["prefix_cache_hit_tokens"]))
    lines.append(row_i.format("Preemptions:", result["num_preemptions"]))
    lines.append(row_i.format("Recomputed tokens:", result["recomputed_tokens"]))
    swapped = (result["swapped_out_bytes"] + result["swapped_in_bytes"]) / 2**20
    lines.append(row_f.format("Swapped bytes, out + in (MiB):", swapped))
    lines.append(row_f.format("Mean running requests:", result["mean_num_running"]))
    lines.append(row_i.format("Peak running requests:", result["max_num_running"]))
    lines.append(row_i.format("Rejected requests:", result["num_rejected"]))
    for reason, count in result.get("rejected_reasons", {}).items():
        lines.append(row_i.format(f"  {reason}:", count))
    lines.append("=" * 50)
    return "\n".join(lines)
