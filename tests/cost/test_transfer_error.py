"""The transfer errors that the cost-model line prints and a transferred band widens by are the
ones the Vidur check measures: recomputed here from the shipped subset of Vidur's tables
(tests/fixtures/vidur/), and the shipped table is the one the benchmark writes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pagesim.config import EngineConfig
from pagesim.cost.base import BatchShape
from pagesim.cost.profile import Profile
from pagesim.cost.transfer import TransferCostModel
from pagesim.cost.transfer_error import (
    ERRORS_FILE,
    SERVED_FILE,
    ServedError,
    band_widening_pct,
    read_served,
    transfer_note,
)
from pagesim.data import transfer_dir
from pagesim.errors import PagesimError
from pagesim.sim.build import (
    cost_model_line,
    scaled_cost_model,
    session_band,
    step_time_band,
    transfer_errors,
    transfer_profile,
    transfer_served,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import transfer_vs_vidur as check  # noqa: E402


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return check.all_rows()


def test_the_shipped_errors_are_the_measured_ones(rows, tmp_path) -> None:
    measured = check.gpu_errors(rows)
    shipped = transfer_errors()
    assert set(measured) == set(shipped)
    check.write_gpu_errors(rows, tmp_path / "errors.csv")
    assert (tmp_path / "errors.csv").read_bytes() == (transfer_dir() / ERRORS_FILE).read_bytes()
    for gpu, err in shipped.items():
        assert err.gemm == pytest.approx(measured[gpu]["gemm"], abs=0.05)
        assert err.elementwise == pytest.approx(measured[gpu]["elementwise"], abs=0.05)
        if err.allreduce is None:
            assert "allreduce" not in measured[gpu]
        else:
            assert err.allreduce == pytest.approx(measured[gpu]["allreduce"], abs=0.05)


def test_every_gpu_has_a_held_out_model_and_every_table_is_read(rows) -> None:
    for gpu in ("h100", "a100", "a40"):
        cases = {(r["model"], r["held_out"]) for r in rows if r["vidur_gpu"] == gpu and r["model"]}
        assert any(held for _, held in cases) and any(not held for _, held in cases)
    per_case = {(r["vidur_gpu"], r["model"], r["tp"]) for r in rows if r["model"]}
    assert len(per_case) == len(check.CASES)
    # 13 token counts (Vidur measured 2048 and 4096 twice) x 9 operations per case
    assert sum(1 for r in rows if r["family"] != "allreduce") == 15 * 9 * len(check.CASES)


def test_the_note_names_the_check_or_says_there_was_none() -> None:
    errors = transfer_errors()
    assert f"GEMMs {errors['h100-sxm'].gemm:g} %" in transfer_note("h100-sxm", errors)
    assert "not measured on l40s" in transfer_note("l40s", transfer_errors())


def test_a_transferred_band_widens_by_the_gpus_gemm_error() -> None:
    shipped = transfer_errors()
    pct, why = band_widening_pct("a100-80gb", shipped)
    assert pct == shipped["a100-80gb"].gemm and "A100" in why
    pct, why = band_widening_pct("l40s", shipped)  # unchecked: the worst checked GPU's
    assert pct == max(e.gemm for e in shipped.values()) and "l40s unchecked" in why


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_the_check_scores_the_allreduce_that_a_tp2_run_prices(rows, gpu) -> None:
    # the transfer's all-reduce in the Vidur check is the one `pagesim run --gpu GPU
    # --model llama-3-70b --tensor-parallel-size 2` prices a step's all-reduces with
    engine = EngineConfig(model="llama-3-70b", gpu=gpu, tensor_parallel_size=2)
    run = scaled_cost_model(engine, None, 1.0, transfer=True)
    assert isinstance(run, TransferCostModel)
    per_token = run.model.hidden_size * run.model.dtype_bytes
    checked = [r for r in rows if r["family"] == "allreduce" and r["gpu"] == gpu]
    assert len(checked) == 3 * 64
    for r in checked:
        if r["tp"] == 2 and r["size"] % per_token == 0:  # a whole number of tokens: a step
            step = run.step_time_breakdown(BatchShape.prefill(r["size"] // per_token))
            assert r["transfer_ms"] == pytest.approx(
                step["allreduce"] / run.num_allreduces * 1e3, rel=1e-9
            )
        assert r["transfer_ms"] == pytest.approx(
            run.allreduce_call_s(r["size"], gpus=r["tp"]) * 1e3, rel=1e-9
        )


def test_a_tensor_parallel_band_weighs_in_the_allreduce_error() -> None:
    shipped = transfer_errors()
    a100 = shipped["a100-80gb"]
    assert a100.allreduce is not None and a100.allreduce > a100.gemm
    assert band_widening_pct("a100-80gb", shipped, 0.0)[0] == a100.gemm  # TP 1 as before
    pct, why = band_widening_pct("a100-80gb", shipped, 0.25)
    assert pct == pytest.approx(0.75 * a100.gemm + 0.25 * a100.allreduce, abs=0.05)
    assert "all-reduces" in why and "25 %" in why
    # a GPU whose all-reduces nobody measured takes the largest all-reduce error measured
    worst = max(e.allreduce for e in shipped.values() if e.allreduce is not None)
    pct, why = band_widening_pct("h100-pcie", shipped, 0.1)
    gemm = max(e.gemm for e in shipped.values())
    assert pct == pytest.approx(0.9 * gemm + 0.1 * worst, abs=0.05) and "unchecked" in why


def test_the_allreduce_share_is_the_largest_a_step_gives_them() -> None:
    engine = EngineConfig(model="llama-3-70b", gpu="a100-80gb", tensor_parallel_size=2)
    t = scaled_cost_model(engine, None, 1.0, transfer=True)
    assert isinstance(t, TransferCostModel)
    share = t.allreduce_share()
    assert 0.05 < share < 0.3
    for shape in (
        BatchShape.decode(1, 1),
        BatchShape.decode(64, 2048),
        BatchShape.mixed(512, 0, 32, 1024),
        BatchShape.prefill(4096),
    ):
        parts = t.step_time_breakdown(shape)
        assert parts["allreduce"] / sum(parts.values()) <= share
    one = scaled_cost_model(EngineConfig(model="llama-2-7b", gpu="a100-80gb"), None, 1.0, True)
    assert isinstance(one, TransferCostModel) and one.allreduce_share() == 0.0


def test_a_tensor_parallel_runs_band_and_line_count_the_allreduce_error() -> None:
    errors = transfer_errors()["a100-80gb"]
    tp2 = EngineConfig(model="llama-3-70b", gpu="a100-80gb", tensor_parallel_size=2)
    tp1 = EngineConfig(model="llama-3-8b", gpu="a100-80gb")
    band1, band2 = step_time_band(tp1, None, True), step_time_band(tp2, None, True)
    assert band1 is not None and band2 is not None
    for config, band, pct in ((tp1, band1, errors.gemm), (tp2, band2, None)):
        source = transfer_profile(config)
        assert source is not None
        meta = Profile.load_metadata(source)
        base = session_band(meta)
        assert base is not None
        if pct is None:  # TP 2: between the GEMM and the all-reduce error, weighted
            t = scaled_cost_model(config, None, 1.0, transfer=True)
            assert isinstance(t, TransferCostModel)
            share = t.allreduce_share()
            operations = band_widening_pct(config.gpu, transfer_errors(), share)[0]
            assert errors.gemm < operations < (errors.allreduce or 0.0)
            pct = band_widening_pct(config.gpu, transfer_errors(), share, transfer_served())[0]
        else:  # the served runs' error where it is larger
            pct = max(pct, *(e.mean_tpot_pct for e in transfer_served().values()))
        assert band.low == pytest.approx(base.low * (1 - pct / 100), rel=1e-12)
        assert band.high == pytest.approx(base.high * (1 + pct / 100), rel=1e-12)
    assert "all-reduces 24.7 %" in band2.basis and "all-reduce" not in band1.basis
    line = cost_model_line(tp2, None)
    served = ", or by the end-to-end error of served runs where that is larger"
    assert line.endswith(
        "widened by the GEMM and all-reduce errors, weighted by the all-reduces' largest share "
        f"of a step{served}"
    )
    assert cost_model_line(tp1, None).endswith(f"widened by the GEMM error{served}")


def test_a_served_error_above_the_operations_one_widens_the_band() -> None:
    shipped = transfer_errors()
    h100 = shipped["h100-sxm"].gemm
    served = {"h100-sxm": ServedError(15.7, "NVIDIA H100 80GB HBM3", "runs")}
    pct, why = band_widening_pct("h100-sxm", shipped, 0.0, served)
    assert pct == 15.7 and "H100 80GB HBM3" in why and f"Vidur's H100: {h100:g} %" in why
    pct, why = band_widening_pct("a100-80gb", shipped, 0.0, served)  # the largest served
    assert pct == 15.7 and "a100-80gb never served" in why
    small = {"h100-sxm": ServedError(h100 / 2, "NVIDIA H100 80GB HBM3", "runs")}
    assert band_widening_pct("h100-sxm", shipped, 0.0, small) == band_widening_pct(
        "h100-sxm", shipped
    )


def test_the_served_table_reads_or_says_what_is_wrong(tmp_path) -> None:
    assert read_served(tmp_path / SERVED_FILE) == {}
    bad = tmp_path / SERVED_FILE
    bad.write_text("gpu,mean_tpot_pct,served_on,runs\nh100-sxm,fast,H100,x\n")
    with pytest.raises(PagesimError, match="cannot read the served transfer errors"):
        read_served(bad)


def test_the_shipped_served_error_is_the_one_the_runs_give() -> None:
    import band_vs_repeats

    shipped = read_served(transfer_dir() / SERVED_FILE)
    for gpu, served in shipped.items():
        rows = [
            row
            for folder in served.runs.split()
            for name, docs in band_vs_repeats.groups(ROOT / folder).items()
            for row in band_vs_repeats.check(name, docs, gpu)
        ]
        assert served.mean_tpot_pct == band_vs_repeats.worst_mean_tpot_error(rows)
