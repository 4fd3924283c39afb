"""The analytical model against the measured steps of the shipped H200 profiles (no GPU).

    python benchmarks/analytical_vs_measured.py [--out results/analytical_vs_measured.csv]

Configurations without a calibration profile (llama-3-70b at TP 4 or 8, any model on another
GPU) are priced by the analytical roofline, whose efficiencies are assumptions. The shipped
profiles (`calibration/h200/<model>/`, block 16: llama-2-7b, llama-3-8b, and llama-3-70b at
TP 2, all with CUDA graphs) time every decode and prefill row on the GPU, so they say how far
the roofline is from this runner on this GPU, per kind of step: decode rows over batch and
context, prefill rows over new and cached tokens. The roofline's device part is compared (its
host-overhead term left out: the profiles keep host time in a table of its own).

Then a refit: the four efficiencies plus one fixed time per layer (what the roofline has no
term for: each layer's dozen kernels have a latency of their own, whatever their size),
fitted by least squares on the log ratio over the one-GPU rows alone, applied to every row.
How close the TP-2 rows come says whether the form carries to a model and a TP size it was
not fitted on; once with the roofline's all-reduce term, once with the TP profile's measured
all-reduce table in its place (`allreduce.csv`: 25-38 us for a decode step's messages on
2 x H200, where the roofline assumes 10 us plus bandwidth). Prints a table; writes CSV.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from pagesim.config import EngineConfig
from pagesim.cost.allreduce_pricing import allreduce_pricer
from pagesim.cost.analytical import AnalyticalConstants, AnalyticalCostModel
from pagesim.cost.base import BatchShape
from pagesim.cost.profile import Profile

ROOT = Path(__file__).resolve().parents[1]
CAL = ROOT / "calibration" / "h200"
PROFILES = (("llama-2-7b", 1, CAL / "llama-2-7b"), ("llama-3-8b", 1, CAL / "llama-3-8b"),
            ("llama-3-70b", 2, CAL / "llama-3-70b-tp2"))
BLOCK_SIZE = 16
FITTED = ("weight_bandwidth_efficiency", "gemm_flops_efficiency",
          "attention_bandwidth_efficiency", "attention_flops_efficiency")


@dataclasses.dataclass
class Rows:
    """One profile's decode and prefill rows at block 16, with the shapes to price them."""

    model: str
    tp: int
    num_layers: int
    kinds: list[str]
    shapes: list[BatchShape]
    measured_ms: np.ndarray
    labels: list[tuple[int, int]]  # (batch, context) or (new tokens, cached tokens)


def load_rows(model: str, tp: int, path: Path) -> Rows:
    profile = Profile.load(path)
    kinds, shapes, measured, labels = [], [], [], []
    for kind, table, make in (("decode", profile.decode, BatchShape.decode),
                              ("prefill", profile.prefill, BatchShape.prefill)):
        for r in table:
            if r.block_size == BLOCK_SIZE:
                label = ((r.batch_size, r.context_len) if kind == "decode"
                         else (r.num_new_tokens, r.num_cached_tokens))
                kinds.append(kind)
                shapes.append(make(*label, BLOCK_SIZE))
                measured.append(r.step_time_ms)
                labels.append(label)
    spec = EngineConfig.create(model=model, gpu="h200").model_spec
    return Rows(model, tp, spec.num_layers, kinds, shapes, np.asarray(measured), labels)


def device_ms(rows: Rows, constants: AnalyticalConstants, per_layer_s: float = 0.0,
              allreduce=None) -> np.ndarray:
    """The roofline's step time less its host-overhead term, plus a fixed time per layer;
    `allreduce` (tokens -> seconds), when given, replaces the roofline's all-reduce term."""
    config = EngineConfig.create(model=rows.model, gpu="h200", tensor_parallel_size=rows.tp)
    cm = AnalyticalCostModel(config.model_spec, config.gpu_spec, tensor_parallel_size=rows.tp,
                             constants=constants)
    out = []
    for shape in rows.shapes:
        parts = cm.step_time_breakdown(shape)
        if allreduce is not None and parts["allreduce"]:
            parts["allreduce"] = allreduce(shape.total_tokens)
        out.append(sum(v for k, v in parts.items() if k != "overhead")
                   + per_layer_s * rows.num_layers)
    return 1e3 * np.asarray(out)


def refit(train: list[Rows]) -> tuple[AnalyticalConstants, float]:
    """Efficiencies and a per-layer time that fit `train` best (least squares on log ratio)."""
    base = AnalyticalConstants()

    def unpack(x: np.ndarray) -> tuple[AnalyticalConstants, float]:
        return dataclasses.replace(base, **dict(zip(FITTED, x[:4], strict=True))), x[4]

    def residuals(x: np.ndarray) -> np.ndarray:
        c, per_layer = unpack(x)
        return np.concatenate([np.log(device_ms(r, c, per_layer) / r.measured_ms)
                               for r in train])

    x0 = np.array([getattr(base, n) for n in FITTED] + [0.0])
    fit = least_squares(residuals, x0, bounds=([0.05] * 4 + [0.0], [1.0] * 4 + [1e-3]))
    return unpack(fit.x)


def summary(errors: np.ndarray) -> str:
    return (f"median {np.median(errors):+6.1f} %, range {errors.min():+6.1f} .. "
            f"{errors.max():+6.1f} %, mean |error| {np.mean(np.abs(errors)):5.1f} %")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/analytical_vs_measured.csv")
    a = ap.parse_args()
    profiles = [load_rows(model, tp, path) for model, tp, path in PROFILES]
    constants, per_layer_s = refit([r for r in profiles if r.tp == 1])
    fitted = ", ".join(f"{n} {getattr(constants, n):.3f}" for n in FITTED)
    table = []
    print("error % of the roofline's device time against the measured rows (block 16)")
    for (model, tp, path), rows in zip(PROFILES, profiles, strict=True):
        default = device_ms(rows, AnalyticalConstants())
        refitted = device_ms(rows, constants, per_layer_s)
        measured_ar = refitted
        if tp > 1:
            config = EngineConfig.create(model=model, gpu="h200", tensor_parallel_size=tp)
            pricer, _ = allreduce_pricer(Profile.load(path), config.model_spec, None)
            measured_ar = device_ms(rows, constants, per_layer_s, pricer)
        held_out = " (held out of the refit)" if rows.tp > 1 else ""
        for kind in ("decode", "prefill"):
            sel = np.array([k == kind for k in rows.kinds])
            err = {name: 100 * (t[sel] / rows.measured_ms[sel] - 1) for name, t in (
                ("default", default), ("refit", refitted), ("measured_ar", measured_ar))}
            print(f"{rows.model} TP {rows.tp} {kind:7s} {sel.sum():3d} rows{held_out}\n"
                  f"    default: {summary(err['default'])}\n"
                  f"    refit:   {summary(err['refit'])}"
                  + (f"\n    refit, measured all-reduce: {summary(err['measured_ar'])}"
                     if tp > 1 else ""))
        for i, kind in enumerate(rows.kinds):
            table.append({"model": rows.model, "tp": rows.tp, "kind": kind,
                          "size": rows.labels[i][0], "context": rows.labels[i][1],
                          "measured_ms": round(float(rows.measured_ms[i]), 3),
                          "analytical_ms": round(float(default[i]), 3),
                          "error_pct": round(float(100 * (default[i] / rows.measured_ms[i] - 1)),
                                             1),
                          "refit_ms": round(float(refitted[i]), 3),
                          "refit_error_pct": round(float(
                              100 * (refitted[i] / rows.measured_ms[i] - 1)), 1),
                          "refit_measured_allreduce_ms": round(float(measured_ar[i]), 3)})
    print(f"refit on the one-GPU rows: {fitted}, {1e6 * per_layer_s:.1f} us per layer")
    with open(a.out, "w", newline="") as f:
        for model, tp, path in PROFILES:  # where each measurement comes from
            m = Profile.load(path).metadata
            f.write(f"# {model} TP {tp}: {path.relative_to(ROOT)}, {m.gpu_name}, driver "
                    f"{m.driver}, torch {m.torch}, triton {m.triton}, {m.date}\n")
        f.write("# size, context: decode batch and context, or prefill new and cached tokens; "
                "times are the device part (no host-overhead term)\n")
        f.write(f"# refit (one-GPU rows only): {fitted}, {1e6 * per_layer_s:.1f} us per layer\n")
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
