"""Trace readers: Azure and Vidur CSV, Mooncake JSONL (optionally gzip-compressed).

Formats, told apart by extension and columns:

- Azure LLM inference 2023 CSV: `TIMESTAMP` (date-time), `ContextTokens`, `GeneratedTokens`.
- Vidur CSV: `num_prefill_tokens`, `num_decode_tokens`, optional `arrived_at` (seconds).
- Mooncake JSONL: one `{"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}`
  per line; `hash_ids` (512-token blocks) is optional, and when present must hold exactly
  ceil(input_length / 512) non-negative ids.

All lengths must be finite non-negative integers; a zero length is raised to 1 token, as Vidur's
trace generators clip (a request needs a prompt token and generates at least one token).
Timestamps become seconds from the trace's first request; rows are put in time order (a stable
sort, so a sorted trace keeps its order). Any malformed input raises `WorkloadError` naming the
file, row and value.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.errors import WorkloadError
from pagesim.workload.tokens import MOONCAKE_BLOCK_TOKENS

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")  # + optional arrived_at
CSV_SUFFIXES = (".csv", ".csv.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True, eq=False)
class TraceData:
    """One trace, as columns in time order (rows = requests)."""

    path: str
    format: str  # "azure" | "vidur" | "mooncake"
    prompt_lens: np.ndarray  # int64 [rows], tokens >= 1
    output_lens: np.ndarray  # int64 [rows], tokens >= 1
    timestamps_s: np.ndarray | None  # float64 [rows], seconds from the first request
    block_offsets: np.ndarray | None  # int64 [rows + 1]: row r's ids are ids[off[r]:off[r+1]]
    block_ids: np.ndarray | None  # int64 [total ids], Mooncake hash_ids

    @property
    def num_rows(self) -> int:
        return len(self.prompt_lens)


def is_trace_path(path: str | Path) -> bool:
    name = str(path).lower()
    return name.endswith(CSV_SUFFIXES + JSONL_SUFFIXES)


def read_trace(path: str | Path) -> TraceData:
    """Read a trace file; the format follows from its extension and columns."""
    p = Path(path)
    name = p.name.lower()
    if not p.is_file():
        raise WorkloadError(f"trace file {str(p)!r} not found")
    if name.endswith(CSV_SUFFIXES):
        return _read_csv(p)
    if name.endswith(JSONL_SUFFIXES):
        return _read_jsonl(p)
    raise WorkloadError(
        f"trace file {str(p)!r}: unknown extension (expected "
        f"{', '.join(CSV_SUFFIXES + JSONL_SUFFIXES)})"
    )


def _read_csv(p: Path) -> TraceData:
    try:
        df = pd.read_csv(p, compression="infer")
    except (OSError, EOFError, ValueError) as e:  # pandas' parse errors, bad UTF-8: ValueErrors
        raise WorkloadError(f"trace {str(p)!r}: cannot parse CSV: {_one_line(e)}") from None
    cols = set(df.columns)
    tcol: str | None
    if set(AZURE_COLUMNS) <= cols:
        fmt, pcol, ocol, tcol = "azure", "ContextTokens", "GeneratedTokens", "TIMESTAMP"
    elif set(VIDUR_COLUMNS) <= cols:
        fmt, pcol, ocol = "vidur", "num_prefill_tokens", "num_decode_tokens"
        tcol = "arrived_at" if "arrived_at" in cols else None
    else:
        raise WorkloadError(
            f"trace {str(p)!r}: missing columns; found {', '.join(map(str, df.columns))}; "
            f"expected Azure ({', '.join(AZURE_COLUMNS)}) or Vidur "
            f"([arrived_at,] {', '.join(VIDUR_COLUMNS)})"
        )
    if len(df) == 0:
        raise WorkloadError(f"trace {str(p)!r}: no rows")
    prompt = _lengths(df[pcol], p, pcol)
    output = _lengths(df[ocol], p, ocol)
    times = None
    if tcol == "TIMESTAMP":
        ts = pd.to_datetime(df[tcol], format="ISO8601", errors="coerce")
        _no_bad_row(ts.isna().to_numpy(), df[tcol], p, tcol, "not a valid value")
        times = (ts - ts.min()).dt.total_seconds().to_numpy(dtype=np.float64)
    elif tcol is not None:
        t = pd.to_numeric(df[tcol], errors="coerce").to_numpy(dtype=np.float64)
        _no_bad_row(~np.isfinite(t), df[tcol], p, tcol, "not a valid value")
        times = t - t.min()
    return _ordered(TraceData(str(p), fmt, prompt, output, times, None, None))


def _lengths(col: pd.Series, p: Path, name: str) -> np.ndarray:
    x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    _no_bad_row(~np.isfinite(x), col, p, name, "not a valid value")
    _no_bad_row((x < 0) | (x != np.round(x)), col, p, name, "must be an integer >= 0")
    return np.maximum(x.astype(np.int64), 1)


def _no_bad_row(bad: np.ndarray, col: pd.Series, p: Path, name: str, why: str) -> None:
    """A one-line error naming the first row where `bad` holds, if any."""
    idx = np.flatnonzero(bad)
    if len(idx):
        r = int(idx[0])
        value = col.iloc[r]
        if pd.isna(value):  # an empty cell: say so, not the NaN pandas read it as
            raise WorkloadError(f"trace {str(p)!r} row {r + 1}: {name} is missing")
        raise WorkloadError(f"trace {str(p)!r} row {r + 1}: {name} = {_show(value)} ({why})")


def _read_jsonl(p: Path) -> TraceData:
    opener = gzip.open if p.name.lower().endswith(".gz") else open
    prompt: list[int] = []
    output: list[int] = []
    stamps: list[float] = []
    ids: list[int] = []
    offsets: list[int] = [0]
    with_ids: bool | None = None
    try:
        with opener(p, "rt", encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"trace {str(p)!r} line {line_no}"
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise WorkloadError(f"{where}: malformed JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise WorkloadError(f"{where}: expected a JSON object, got {row!r:.60}")
                for key in ("timestamp", "input_length", "output_length"):
                    if key not in row:
                        raise WorkloadError(
                            f"{where}: missing key {key!r} (Mooncake rows need "
                            f"timestamp, input_length, output_length[, hash_ids])"
                        )
                stamps.append(_json_number(row["timestamp"], where, "timestamp") / 1000.0)
                n_in = _json_count(row["input_length"], where, "input_length")
                prompt.append(max(n_in, 1))
                output.append(max(_json_count(row["output_length"], where, "output_length"), 1))
                has = "hash_ids" in row
                if with_ids is None:
                    with_ids = has
                elif has != with_ids:
                    raise WorkloadError(f"{where}: hash_ids present in some rows only")
                if has:
                    ids.extend(_hash_ids(row["hash_ids"], n_in, where))
                    offsets.append(len(ids))
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise WorkloadError(f"trace {str(p)!r}: cannot read: {_one_line(e)}") from None
    if not prompt:
        raise WorkloadError(f"trace {str(p)!r}: no rows")
    t = np.asarray(stamps, dtype=np.float64)
    data = TraceData(
        str(p),
        "mooncake",
        np.asarray(prompt, dtype=np.int64),
        np.asarray(output, dtype=np.int64),
        t - t.min(),
        np.asarray(offsets, dtype=np.int64) if with_ids else None,
        np.asarray(ids, dtype=np.int64) if with_ids else None,
    )
    return _ordered(data)


def _json_number(v: object, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise WorkloadError(f"{where}: {key} = {v!r} (must be a number)")
    return float(v)


def _json_count(v: object, where: str, key: str) -> int:
    x = _json_number(v, where, key)
    if x < 0 or x != int(x):
        raise WorkloadError(f"{where}: {key} = {v!r} (must be an integer >= 0)")
    return int(x)


def _hash_ids(v: object, n_in: int, where: str) -> list[int]:
    if not isinstance(v, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in v
    ):
        raise WorkloadError(f"{where}: hash_ids = {v!r:.60} (must be a list of integers >= 0)")
    need = -(-n_in // MOONCAKE_BLOCK_TOKENS)
    if len(v) != need:
        raise WorkloadError(
            f"{where}: hash_ids has {len(v)} ids; input_length {n_in} needs "
            f"{need} blocks of {MOONCAKE_BLOCK_TOKENS} tokens"
        )
    return v


def _ordered(d: TraceData) -> TraceData:
    """Rows in time order (stable), CSR offsets rebuilt when rows move."""
    if d.timestamps_s is None or bool(np.all(np.diff(d.timestamps_s) >= 0)):
        return d
    order = np.argsort(d.timestamps_s, kind="stable")
    offsets, ids = d.block_offsets, d.block_ids
    if offsets is not None and ids is not None:
        counts = np.diff(offsets)[order]
        ids = np.concatenate([ids[offsets[r] : offsets[r + 1]] for r in order])
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    prompt, output, times = d.prompt_lens[order], d.output_lens[order], d.timestamps_s[order]
    return TraceData(d.path, d.format, prompt, output, times, offsets, ids)


def _show(v: object) -> str:
    """repr of a cell, with numpy scalars shown as plain Python values."""
    item = getattr(v, "item", None)
    return repr(item() if callable(item) else v)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__
