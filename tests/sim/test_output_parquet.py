"""The per-step Parquet file is streamed a row group at a time from the collector (spill
chunks and the in-memory tail) and must equal one write of the whole table, byte for byte."""

from __future__ import annotations

from array import array

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pagesim.metrics import STEP_COLUMNS, MetricsCollector
from pagesim.sim import output
from pagesim.sim.output import steps_table, write_steps_parquet


def collector(num_steps: int, chunk_steps: int) -> MetricsCollector:
    """A collector holding `num_steps` random steps, spilled in chunks of `chunk_steps`."""
    values = np.random.default_rng(num_steps).random(num_steps * len(STEP_COLUMNS))
    m = MetricsCollector()
    chunk = chunk_steps * len(STEP_COLUMNS)
    full = len(values) // chunk * chunk
    for i in range(0, full, chunk):
        m.step_spill.write(array("d", values[i : i + chunk].tobytes()))
    m.step_values.extend(array("d", values[full:].tobytes()))
    assert m.num_steps == num_steps
    return m


@pytest.mark.parametrize("num_steps", [0, 1, 999, 1000, 1001, 3500])
def test_streamed_steps_equal_one_whole_write(tmp_path, monkeypatch, num_steps):
    monkeypatch.setattr(output, "PARQUET_ROW_GROUP_ROWS", 1000)
    m = collector(num_steps, chunk_steps=300)
    write_steps_parquet(m, tmp_path / "steps.parquet")
    whole = pa.BufferOutputStream()
    pq.write_table(
        steps_table(m), whole, row_group_size=1000, compression="zstd", write_statistics=False
    )
    assert (tmp_path / "steps.parquet").read_bytes() == whole.getvalue().to_pybytes()
    assert pq.ParquetFile(tmp_path / "steps.parquet").num_row_groups == max(
        1, -(-num_steps // 1000)
    )


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    def broken(schema, parts):
        raise OSError("disk full")

    monkeypatch.setattr(output, "_step_rows", broken)
    with pytest.raises(OSError, match="disk full"):
        write_steps_parquet(collector(10, 4), tmp_path / "steps.parquet")
    assert list(tmp_path.iterdir()) == []
