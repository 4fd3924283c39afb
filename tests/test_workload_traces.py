"""Trace readers: each format parsed from small fixture files, and every malformed input
rejected with one line naming the file, row and value."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from pagesim.errors import WorkloadError
from pagesim.workload import load_workload
from pagesim.workload.traces import read_trace

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,0,20
"""
VIDUR_TIMED = "arrived_at,num_prefill_tokens,num_decode_tokens\n10.5,100,7\n11.0,200,8\n"
VIDUR_LENGTHS = (
    "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
    "3772,54,3826,69.8\n2015,156,2171,12.9\n"
)


def _mooncake_rows() -> list[dict]:
    return [
        {"timestamp": 0, "input_length": 1300, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 250, "input_length": 600, "output_length": 9, "hash_ids": [0, 3]},
        {"timestamp": 1250, "input_length": 100, "output_length": 2, "hash_ids": [4]},
    ]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _jsonl(path: Path, rows: list) -> Path:
    return _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def test_azure_csv(tmp_path: Path) -> None:
    t = read_trace(_write(tmp_path / "az.csv", AZURE))
    assert t.format == "azure"
    assert t.prompt_lens.tolist() == [374, 396, 1]  # a 0-token prompt is raised to 1 (Vidur)
    assert t.output_lens.tolist() == [44, 109, 20]
    assert np.allclose(t.timestamps_s, [0.0, 4.314579, 4.541877])
    assert t.block_ids is None


def test_vidur_csv_with_and_without_arrivals(tmp_path: Path) -> None:
    timed = read_trace(_write(tmp_path / "v.csv", VIDUR_TIMED))
    assert timed.format == "vidur"
    assert timed.timestamps_s.tolist() == [0.0, 0.5]  # relative to the first request
    lengths = read_trace(_write(tmp_path / "l.csv", VIDUR_LENGTHS))
    assert lengths.timestamps_s is None
    assert lengths.prompt_lens.tolist() == [3772, 2015]
    assert lengths.output_lens.tolist() == [54, 156]


def test_mooncake_jsonl_and_gzip(tmp_path: Path) -> None:
    rows = _mooncake_rows()
    plain = read_trace(_jsonl(tmp_path / "m.jsonl", rows))
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress((tmp_path / "m.jsonl").read_bytes()))
    for t in (plain, read_trace(gz)):
        assert t.format == "mooncake"
        assert t.timestamps_s.tolist() == [0.0, 0.25, 1.25]  # milliseconds -> seconds
        assert t.prompt_lens.tolist() == [1300, 600, 100]
        assert t.block_offsets.tolist() == [0, 3, 5, 6]
        assert t.block_ids.tolist() == [0, 1, 2, 0, 3, 4]


def test_unsorted_rows_are_put_in_time_order(tmp_path: Path) -> None:
    rows = _mooncake_rows()
    t = read_trace(_jsonl(tmp_path / "m.jsonl", [rows[2], rows[0], rows[1]]))
    assert t.prompt_lens.tolist() == [1300, 600, 100]
    assert t.block_ids.tolist() == [0, 1, 2, 0, 3, 4]
    assert t.timestamps_s.tolist() == [0.0, 0.25, 1.25]


def test_trace_file_given_directly_replays_it(tmp_path: Path) -> None:
    plan = load_workload(str(_write(tmp_path / "az.csv", AZURE))).sample(5, seed=0)
    assert plan.arrival.process == "trace"
    assert plan.prompt_lens.tolist() == [374, 396, 1, 374, 396]  # wraps around
    period = 4.541877 * 3 / 2  # duration + mean gap
    assert np.allclose(plan.trace_times_s, [0, 4.314579, 4.541877, period, period + 4.314579])


BAD_CSV = {
    "missing_columns": ("a,b\n1,2\n", "missing columns"),
    "negative": (
        "num_prefill_tokens,num_decode_tokens\n5,3\n-4,2\n",
        "row 2: num_prefill_tokens = -4",
    ),
    "fractional": ("num_prefill_tokens,num_decode_tokens\n5.5,3\n", "num_prefill_tokens = 5.5"),
    "garbage": ("num_prefill_tokens,num_decode_tokens\n5,abc\n", "num_decode_tokens = 'abc'"),
    "empty_rows": ("num_prefill_tokens,num_decode_tokens\n", "no rows"),
    "empty_file": ("", "cannot parse CSV"),
    "bad_time": (
        "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,4,5\n",
        "TIMESTAMP = 'yesterday'",
    ),
    "nan_time": ("arrived_at,num_prefill_tokens,num_decode_tokens\n,4,5\n", "arrived_at"),
}


@pytest.mark.parametrize("case", sorted(BAD_CSV))
def test_bad_csv_raises_one_line(tmp_path: Path, case: str) -> None:
    text, needle = BAD_CSV[case]
    path = _write(tmp_path / f"{case}.csv", text)
    with pytest.raises(WorkloadError) as e:
        load_workload(str(path))
    msg = str(e.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


BAD_JSONL = {
    "malformed": ('{"timestamp": 0, "input_length": 5\n', "line 1: malformed JSON"),
    "missing_key": ('{"timestamp": 0, "output_length": 5}\n', "missing key 'input_length'"),
    "negative": ('{"timestamp": 0, "input_length": -5, "output_length": 1}\n', "input_length = -5"),
    "hash_count": (
        '{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}\n',
        "hash_ids has 1 ids; input_length 1000 needs 2",
    ),
    "hash_type": (
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["a"]}\n',
        "hash_ids",
    ),
    "not_object": ("[1, 2]\n", "expected a JSON object"),
    "empty": ("\n", "no rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_JSONL))
def test_bad_jsonl_raises_one_line(tmp_path: Path, case: str) -> None:
    text, needle = BAD_JSONL[case]
    path = _write(tmp_path / f"{case}.jsonl", text)
    with pytest.raises(WorkloadError) as e:
        load_workload(str(path))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not found"):
        load_workload(str(tmp_path / "nope.csv"))
    odd = _write(tmp_path / "trace.txt", "x")
    with pytest.raises(WorkloadError, match="expected .yaml, .csv or .jsonl"):
        load_workload(str(odd))
    bad_gz = tmp_path / "broken.csv.gz"
    bad_gz.write_bytes(b"not gzip at all")
    with pytest.raises(WorkloadError, match="broken.csv.gz"):
        load_workload(str(bad_gz))
