"""`pagesim plan --compare-block-sizes`: a capacity search per block size at the same KV
memory, the costs behind each rate, and the best block size named."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pagesim.cli.app import main
from pagesim.planning.blocksize import best_block_size, block_size_table

PLAN = [
    "plan",
    "--workload",
    "system-prompt",
    "--num-prompts",
    "40",
    "--max-num-seqs",
    "16",
    "--slo",
    "p99_ttft_ms<=1500",
    "--min-duration",
    "3",
    "--rel-tol",
    "0.2",
]


def test_compare_block_sizes_prints_a_row_each_and_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "plan.json"
    args = [*PLAN, "--compare-block-sizes", "64,16", "--save-result", str(out_file)]
    assert main(args) == 0
    out = capsys.readouterr().out
    doc = json.loads(out_file.read_text())
    rows = doc["compare_block_sizes"]
    assert [r["block_size"] for r in rows] == [16, 64]
    blocks = {r["block_size"]: r["num_gpu_blocks"] for r in rows}
    assert blocks[16] == pytest.approx(4 * blocks[64], abs=4)  # the same KV memory
    for r in rows:
        assert r["max_rate"] > 0 and r["kernel_measured"]  # the H200 profile timed both
        line = re.search(
            rf"^ +{r['block_size']} +{r['max_rate']:.3f} +[0-9.]+ +measured", out, re.M
        )
        assert line, out
    # system-prompt shares a prefix: hits are counted in whole blocks, so fewer with 64
    hits = {r["block_size"]: r["prefix_hit_rate"] for r in rows}
    assert hits[16] > hits[64] > 0
    best = doc["best"]
    assert best["max_rate"] == max(r["max_rate"] for r in rows)
    assert f"Best block size: {best['block_size']} ({best['max_rate']:.3f} req/s" in out


def test_ties_within_the_search_tolerance_are_named() -> None:
    row = dict(decode_step_ms=1.0, kernel_measured=True, internal_frag=0.0, prefix_hit_rate=0.0)
    rows = [
        {**row, "block_size": 16, "max_rate": 5.0, "binding_slo": None, "refused": None},
        {**row, "block_size": 32, "max_rate": 5.1, "binding_slo": None, "refused": None},
        {**row, "block_size": 64, "max_rate": None, "binding_slo": None, "refused": None},
    ]
    assert best_block_size(rows)["block_size"] == 32
    last = block_size_table(rows, profiled=True, rel_tol=0.025)[-1]
    assert (
        last == "Best block size: 32 (5.100 req/s within the SLOs; 16 within --rel-tol 0.025 of it)"
    )
    assert block_size_table(rows, profiled=True, rel_tol=0.01)[-1].endswith("the SLOs)")


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--compare-block-sizes", "16,x"], "--compare-block-sizes '16,x'"),
        (["--compare-block-sizes", "16,32", "--block-size", "8"], "drop --block-size"),
        (["--compare-block-sizes", "16,32", "--compare-tp", "1,2"], "drop --compare-tp"),
    ],
)
def test_bad_block_size_comparisons_are_one_line(
    extra: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*PLAN, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_a_gpu_without_a_profile_compares_block_sizes_by_transfer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The table is priced by the model the plan's cost-model line names: on the H100, the
    H200 profile carried over (each block size's kernel measured there), not the roofline."""
    from pagesim.config import EngineConfig
    from pagesim.cost.base import BatchShape
    from pagesim.planning.blocksize import KERNEL_SHAPE
    from pagesim.sim.build import scaled_cost_model

    args = [*PLAN, "--model", "llama-2-7b", "--gpu", "h100-sxm", "--compare-block-sizes", "16,64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "\nCost model: transfer of the shipped profile" in out
    batch, context = KERNEL_SHAPE
    for bs in (16, 64):
        engine = EngineConfig.create(model="llama-2-7b", gpu="h100-sxm", block_size=bs)
        carried = scaled_cost_model(engine, None, 1.0, True)
        assert carried is not None
        ms = 1000.0 * carried.step_time(BatchShape.decode(batch, context, bs))
        assert re.search(rf"^ +{bs} +[0-9.]+ +{ms:.3f} +measured", out, re.M), out
