"""The transfer and analytical cost models against Vidur's per-operation GPU measurements.

Vidur (github.com/microsoft/vidur, MIT licence) publishes kernel times measured on A100, H100
and A40 GPUs for each operation of a decoder layer (data/profiling/compute/<gpu>/<model>/
mlp.csv) and for NCCL all-reduces (data/profiling/network/<gpu>_dgx/all_reduce.csv). A subset
of them ships in tests/fixtures/vidur/ (its README says which commit and how it was cut;
`--extract DIR` cuts it again from a git clone of Vidur).

Each measured operation is predicted twice:

* transfer: pagesim's shipped H200 profile of the same layer shapes carried to the GPU
  (`TransferCostModel.kernel_times`; all-reduces: `TransferCostModel.allreduce_call_s` of the
  llama-3-70b TP 2 model that `pagesim run` uses, i.e. the H200's measured all-reduce table
  carried by `carried_allreduce_s`: its smallest message's time kept as the per-call time,
  the rest moved by the ratio of the two GPUs' all-reduce bus bandwidths (`BoundingRates`:
  published NCCL figures where known, else the link's datasheet rate at the H200's share)
  and, for 4 and 8 GPUs, by the ring's bytes per GPU against the table's 2);
* analytical: the analytical model's own terms per operation (each GEMM's roofline at the
  analytical shares of the datasheet; the per-layer fixed time shared among the layer's
  element-wise kernels; its all-reduce term).

Errors are (predicted - measured) / measured. Cases marked held_out were set aside until the
transfer model was frozen (see docs/other_gpus.md). Writes results/transfer_vs_vidur.csv (one
row per operation) and results/transfer_vs_vidur_summary.csv, prints the summary table, writes
the per-GPU figures that pagesim reads (pagesim/data/transfer/errors.csv: the cost-model line's
transfer error and the widening of a transferred GPU's band), and with --update-doc rewrites
the tables in docs/other_gpus.md.

    python benchmarks/transfer_vs_vidur.py [--update-doc]
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pagesim.config import EngineConfig
from pagesim.cost.analytical import AnalyticalConstants
from pagesim.cost.gpu_rates import BoundingRates
from pagesim.cost.operations import LayerWidths, kernel_time, layer_operations
from pagesim.cost.transfer import SOURCE_GPU, TransferCostModel
from pagesim.data import calibration_dir
from pagesim.sim.build import transferred_cost_model
from pagesim.specs import GPUSpec, ModelSpec

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "vidur"
DOC = ROOT / "docs" / "other_gpus.md"
ERRORS_CSV = ROOT / "pagesim" / "data" / "transfer" / "errors.csv"
VIDUR_COMMIT = "7d47513"

GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Case:
    """One Vidur table: which GPU and model it measured, and which H200 profile prices it."""

    vidur_gpu: str  # Vidur's folder name
    gpu: str  # pagesim's GPU name
    vidur_model: str  # Vidur's folder under compute/<gpu>/
    model: str  # pagesim's model with the same layer shapes
    source_model: str  # the model of the shipped H200 profile (same layer shapes)
    tp: int
    held_out: bool

    @property
    def fixture(self) -> str:
        return f"mlp_{self.vidur_gpu}_{self.model}_tp{self.tp}.csv"


CASES: tuple[Case, ...] = (
    Case("h100", "h100-sxm", "meta-llama/Llama-2-7b-hf", "llama-2-7b", "llama-2-7b", 1, False),
    Case("h100", "h100-sxm", "meta-llama/Llama-2-70b-hf", "llama-2-70b", "llama-3-70b", 2, True),
    Case("a100", "a100-80gb", "meta-llama/Llama-2-7b-hf", "llama-2-7b", "llama-2-7b", 1, False),
    Case(
        "a100", "a100-80gb", "meta-llama/Meta-Llama-3-70B", "llama-3-70b", "llama-3-70b", 2, False
    ),
    Case("a100", "a100-80gb", "meta-llama/Llama-2-70b-hf", "llama-2-70b", "llama-3-70b", 2, False),
    Case("a100", "a100-80gb", "meta-llama/Meta-Llama-3-8B", "llama-3-8b", "llama-3-8b", 1, True),
    Case("a40", "a40", "meta-llama/Llama-2-7b-hf", "llama-2-7b", "llama-2-7b", 1, False),
    Case("a40", "a40", "meta-llama/Llama-2-70b-hf", "llama-2-70b", "llama-3-70b", 2, True),
)
#: Vidur's all-reduce tables (one node, NVSwitch) -> pagesim's GPU; held out like the GEMMs?
ALLREDUCE = (("h100", "h100-sxm", False), ("a100", "a100-80gb", False))
ALLREDUCE_WORKERS = (2, 4, 8)


# ---- cutting the fixture from a Vidur clone ----
def extract(vidur_git: Path) -> None:
    """Write tests/fixtures/vidur/ from Vidur's tables at `VIDUR_COMMIT`: per case the median
    of each operation at the token counts `TOKENS`; per all-reduce table the median at every
    16th message size of one node's 2, 4 and 8 GPUs."""
    FIXTURES.mkdir(parents=True, exist_ok=True)

    def table(path: str) -> list[dict]:
        text = subprocess.check_output(
            ["git", "-C", str(vidur_git), "show", f"{VIDUR_COMMIT}:{path}"], text=True
        )
        return list(csv.DictReader(io.StringIO(text)))

    for case in CASES:
        rows = table(f"data/profiling/compute/{case.vidur_gpu}/{case.vidur_model}/mlp.csv")
        keep = [
            r
            for r in rows
            if int(r["num_tensor_parallel_workers"]) == case.tp and int(r["num_tokens"]) in TOKENS
        ]
        with open(FIXTURES / case.fixture, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["num_tokens", "tp", *(f"{op}_ms" for op in GEMMS + ELEMENTWISE)])
            for r in sorted(keep, key=lambda r: int(r["num_tokens"])):
                ops = [r[f"time_stats.{op}.median"] for op in GEMMS + ELEMENTWISE]
                w.writerow([r["num_tokens"], case.tp, *ops])
    for vidur_gpu, _, _ in ALLREDUCE:
        rows = table(f"data/profiling/network/{vidur_gpu}_dgx/all_reduce.csv")
        with open(FIXTURES / f"all_reduce_{vidur_gpu}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["num_workers", "message_bytes", "time_ms"])
            for n in ALLREDUCE_WORKERS:
                mine = [
                    r
                    for r in rows  # all n GPUs on one node
                    if int(r["num_workers"]) == n == int(r["devices_per_node"])
                ]
                sizes = sorted({int(r["size"]) for r in mine})[::16]
                for r in sorted(mine, key=lambda r: int(r["size"])):
                    if int(r["size"]) in sizes:
                        # bytes: Vidur's predictor reads size / hidden / 2 as tokens
                        w.writerow([n, r["size"], r["time_stats.all_reduce.median"]])


# ---- predictions ----
def _read(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def analytical_kernel_ms(op, widths: LayerWidths, gpu: GPUSpec) -> float:
    """The analytical model's price of one run of `op` (module docstring)."""
    c = AnalyticalConstants()
    rates = BoundingRates(
        gpu.name,
        gpu.hbm_bandwidth_bytes_per_s * c.weight_bandwidth_efficiency,
        "datasheet",
        gpu.fp16_flops * c.gemm_flops_efficiency,
        "datasheet",
        (gpu.nvlink_bytes_per_s or gpu.host_link_bytes_per_s) * c.allreduce_bandwidth_efficiency,
        "datasheet",
    )
    t = kernel_time(op, rates)
    if op.family == "elementwise":
        per_layer = sum(o.runs for o in layer_operations(widths, 1) if o.family == "elementwise")
        t += c.per_layer_overhead_s * widths.layers / per_layer
    return t * 1e3


def operation_rows(case: Case) -> list[dict]:
    """One row per measured (operation, token count) of `case`."""
    engine = EngineConfig(model=case.source_model, gpu=case.gpu, tensor_parallel_size=case.tp)
    source = (
        calibration_dir()
        / SOURCE_GPU
        / (case.source_model + (f"-tp{case.tp}" if case.tp > 1 else ""))
    )
    transfer = transferred_cost_model(engine, source)
    model = ModelSpec.from_name(case.model)
    widths = LayerWidths.of(model, case.tp)
    gpu = GPUSpec.from_name(case.gpu)
    out = []
    for r in _read(FIXTURES / case.fixture):
        n = int(r["num_tokens"])
        kernels = transfer.kernel_times(n, 1)  # type: ignore[attr-defined]
        ops = {op.name: op for op in layer_operations(widths, n)}
        for name in GEMMS + ELEMENTWISE:
            out.append(
                {
                    "vidur_gpu": case.vidur_gpu,
                    "gpu": case.gpu,
                    "model": case.model,
                    "tp": case.tp,
                    "held_out": case.held_out,
                    "family": "gemm" if name in GEMMS else "elementwise",
                    "operation": name,
                    "size": n,
                    "measured_ms": float(r[f"{name}_ms"]),
                    "transfer_ms": kernels[name][1] * 1e3,
                    "analytical_ms": analytical_kernel_ms(ops[name], widths, gpu),
                }
            )
    return out


def allreduce_transfer(gpu_name: str) -> TransferCostModel:
    """The transfer model that `pagesim run --gpu GPU --model llama-3-70b
    --tensor-parallel-size 2` prices with: its all-reduces are the H200 profile's measured
    table carried by `pagesim.cost.transfer.carried_allreduce_s`."""
    engine = EngineConfig(model="llama-3-70b", gpu=gpu_name, tensor_parallel_size=2)
    transfer = transferred_cost_model(engine, calibration_dir() / SOURCE_GPU / "llama-3-70b-tp2")
    assert isinstance(transfer, TransferCostModel)
    return transfer


def allreduce_rows(vidur_gpu: str, gpu_name: str, held_out: bool) -> list[dict]:
    """One row per measured all-reduce message size and GPU count."""
    c = AnalyticalConstants()
    gpu = GPUSpec.from_name(gpu_name)
    transfer = allreduce_transfer(gpu_name)
    out = []
    for r in _read(FIXTURES / f"all_reduce_{vidur_gpu}.csv"):
        n, size = int(r["num_workers"]), int(r["message_bytes"])
        ring = 2.0 * (n - 1) / n
        link = gpu.nvlink_bytes_per_s * c.allreduce_bandwidth_efficiency
        out.append(
            {
                "vidur_gpu": vidur_gpu,
                "gpu": gpu_name,
                "model": "",
                "tp": n,
                "held_out": held_out,
                "family": "allreduce",
                "operation": "all_reduce",
                "size": size,
                "measured_ms": float(r["time_ms"]),
                "transfer_ms": transfer.allreduce_call_s(size, gpus=n) * 1e3,
                "analytical_ms": (c.allreduce_latency_s + ring * size / link) * 1e3,
            }
        )
    return out


def all_rows() -> list[dict]:
    rows = [row for case in CASES for row in operation_rows(case)]
    for vidur_gpu, gpu, held in ALLREDUCE:
        rows += allreduce_rows(vidur_gpu, gpu, held)
    for row in rows:
        for model in ("transfer", "analytical"):
            row[f"{model}_error_pct"] = 100.0 * (row[f"{model}_ms"] / row["measured_ms"] - 1.0)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (held out?, GPU, family): median and mean |error| of both models, and how many."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["held_out"], r["vidur_gpu"], r["family"]), []).append(r)
    out = []
    for (held, gpu, family), rs in sorted(groups.items()):
        row = {"held_out": held, "vidur_gpu": gpu, "family": family, "n": len(rs)}
        for model in ("transfer", "analytical"):
            errs = [abs(r[f"{model}_error_pct"]) for r in rs]
            row[f"{model}_median_abs_pct"] = statistics.median(errs)
            row[f"{model}_mean_abs_pct"] = statistics.fmean(errs)
            row[f"{model}_within_10pct"] = sum(e <= 10.0 for e in errs) / len(errs)
        out.append(row)
    return out


def gpu_errors(rows: list[dict]) -> dict[str, dict[str, float]]:
    """pagesim GPU -> family -> median |transfer error| in % over every case, checked and
    held out: the figures that `pagesim.cost.transfer_error` reads (`ERRORS_CSV`)."""
    errs: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        fam = errs.setdefault(r["gpu"], {}).setdefault(r["family"], [])
        fam.append(abs(r["transfer_error_pct"]))
    return {
        gpu: {fam: statistics.median(v) for fam, v in sorted(fams.items())}
        for gpu, fams in sorted(errs.items())
    }


def write_gpu_errors(rows: list[dict], path: Path) -> None:
    """The per-GPU figures as the package reads them: one row per pagesim GPU, the Vidur GPU
    that checked it, and the median |error| in % per family (empty: that family not checked)."""
    checked_as = {r["gpu"]: r["vidur_gpu"] for r in rows}
    families = ("gemm", "elementwise", "allreduce")
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["gpu", "checked_as", *(f"{fam}_median_abs_pct" for fam in families)])
        for gpu, fams in gpu_errors(rows).items():
            values = [f"{fams[fam]:.1f}" if fam in fams else "" for fam in families]
            w.writerow([gpu, checked_as[gpu], *values])


def markdown(table: list[dict], held_out: bool) -> str:
    lines = [
        "| GPU | family | ops | transfer median / mean abs err | analytical median / mean "
        "| within 10 %: transfer / analytical |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in table:
        if r["held_out"] != held_out:
            continue
        lines.append(
            f"| {r['vidur_gpu']} | {r['family']} | {r['n']} "
            f"| {r['transfer_median_abs_pct']:.1f} / {r['transfer_mean_abs_pct']:.1f} % "
            f"| {r['analytical_median_abs_pct']:.1f} / {r['analytical_mean_abs_pct']:.1f} % "
            f"| {100 * r['transfer_within_10pct']:.0f} / "
            f"{100 * r['analytical_within_10pct']:.0f} % |"
        )
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def _update_doc(table: list[dict]) -> None:
    text = DOC.read_text()
    for held, tag in ((False, "checked"), (True, "held-out")):
        start, end = f"<!-- {tag} table -->", f"<!-- end {tag} table -->"
        head, rest = text.split(start)
        _, tail = rest.split(end)
        text = f"{head}{start}\n{markdown(table, held)}\n{end}{tail}"
    DOC.write_text(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--extract", type=Path, help="cut the fixture again from a Vidur git clone")
    p.add_argument("--update-doc", action="store_true", help="rewrite docs/other_gpus.md's tables")
    p.add_argument("--checked-only", action="store_true", help="leave the held-out cases out")
    args = p.parse_args()
    if args.extract:
        extract(args.extract)
    rows = all_rows()
    if args.checked_only:
        rows = [r for r in rows if not r["held_out"]]
    table = summary(rows)
    _write_csv(ROOT / "results" / "transfer_vs_vidur.csv", rows)
    _write_csv(ROOT / "results" / "transfer_vs_vidur_summary.csv", table)
    print("checked against (used while building the model):")
    print(markdown(table, False))
    if not args.checked_only:
        print("\nheld out until the model was frozen:")
        print(markdown(table, True))
        print(f"\nper GPU, every case ({ERRORS_CSV.relative_to(ROOT)}):")
        for gpu, fams in gpu_errors(rows).items():
            print(f"  {gpu}: " + ", ".join(f"{k} {v:.1f} %" for k, v in fams.items()))
        write_gpu_errors(rows, ERRORS_CSV)
    if args.update_doc:
        _update_doc(table)


if __name__ == "__main__":
    main()
