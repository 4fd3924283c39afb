"""`pagesim validate`: the simulator's prediction against a real GPU run of the same traffic.

Both sides draw the same requests: the plan of `(workload, num_prompts, seed)` with the
model's vocabulary and the arrival times of `(request_rate, burstiness, seed)`, exactly as
`pagesim.sim.simulate` draws them (`build_traffic` below is that code path; a multi-turn
workload's later turns follow the same closed loop in wall-clock time), and both use the
KV cache the GPU measured (`num_gpu_blocks_override`). The real side is a wall-clock replay
through the same scheduler (`pagesim.gpu.serve`); the predicted side is `simulate` with the
calibrated profile. Per metric the report gives the real value, the predicted value and the
error `(predicted - real) / real` in %, against the targets below.

A real run is stored as JSON (`save_real_run`), so the simulation half can run on any machine
later (`validate_real_run`): the GPU session ships real runs, the comparison runs on a CPU.
The runs kept under `results/` are compressed with xz (`.json.xz`), a fifth smaller than gzip
on these files (per-token latencies are most of their bytes); `.json.gz` and plain `.json` are
read too.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import math
import re
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from pagesim.config import EngineConfig
from pagesim.cost.base import CostModel
from pagesim.errors import ConfigError, WorkloadError
from pagesim.request import Request
from pagesim.workload.sessions import ClosedLoopSessions

#: metric -> target |error| in %, as the validation issue states them.
TARGETS_PCT: dict[str, float] = {
    "request_throughput": 3.0,
    "output_throughput": 3.0,
    "mean_ttft_ms": 5.0,
    "median_ttft_ms": 10.0,
    "p99_ttft_ms": 10.0,
    "mean_tpot_ms": 3.0,
    "median_tpot_ms": 10.0,
    "p99_tpot_ms": 10.0,
    "mean_itl_ms": 10.0,
    "median_itl_ms": 10.0,
    "p99_itl_ms": 10.0,
    "mean_e2el_ms": 3.0,
    "median_e2el_ms": 10.0,
    "p99_e2el_ms": 10.0,
}
#: metric -> target |error| in % for a load served two or more times, against the mean of its
#: real runs: identical real runs differ by a few % from one another, so the mean is what a
#: prediction of the expected run can meet. The metrics of `SPREAD_WIDENED` are held to the
#: larger of this and half the repeats' own spread (max - min, % of the mean).
REPEAT_TARGETS_PCT: dict[str, float] = {
    "request_throughput": 3.0,
    "output_throughput": 3.0,
    "mean_ttft_ms": 5.0,
    "p99_ttft_ms": 10.0,
    "mean_tpot_ms": 3.0,
    "p99_tpot_ms": 10.0,
    "mean_e2el_ms": 3.0,
    "p99_e2el_ms": 10.0,
}
SPREAD_WIDENED: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "mean_tpot_ms",
    "mean_e2el_ms",
)
REAL_RUN_FORMAT = 1
#: The endings of compressed real runs (plain `.json` ones are read too).
COMPRESSED_RUN_SUFFIXES = (".json.xz", ".json.gz")
#: Decimals of the floats in a real run's records (seconds): 1 ns, the resolution of the host
#: clock (`time.perf_counter`) and finer than CUDA events' 0.5 us. Printed in full, a float
#: carries 17 digits, and the noise digits below the clock's resolution compress worst: they
#: doubled the size of a stored run.
RECORD_DECIMALS = 9
#: Decimals of the floats in a validation report (`report_json`).
REPORT_DECIMALS = 6
#: The first bytes of every file `save_real_run` writes.
_RUN_HEAD = b'{"format":%d,' % REAL_RUN_FORMAT


def build_traffic(
    config: EngineConfig,
    workload: str,
    num_prompts: int,
    seed: int,
    request_rate: float | None,
    burstiness: float = 1.0,
    **workload_params: Any,
) -> list[Request] | ClosedLoopSessions:
    """What `simulate` would send: the requests with their arrival times, or for a
    multi-turn workload its sessions, closed loop (each later turn sent when the previous one
    finished plus its think time, built from the tokens it emitted).

    `workload_params`: `load_workload`'s (random_input_len, ..., time_scale)."""
    from pagesim.sim.arrivals import session_arrival_times
    from pagesim.workload import load_workload

    plan = load_workload(workload, **workload_params).sample(
        num_prompts, seed=seed, vocab_size=config.model_spec.vocab_size
    )
    arrivals = session_arrival_times(plan, request_rate, burstiness, seed)
    if plan.is_multi_turn:
        return ClosedLoopSessions(plan, arrivals)
    return [
        sample
        for s in range(plan.num_sessions)
        for sample in plan.samples(plan.session(s).first_request(float(arrivals[s])))
    ]


def build_requests(
    config: EngineConfig,
    workload: str,
    num_prompts: int,
    seed: int,
    request_rate: float | None,
    burstiness: float = 1.0,
    **workload_params: Any,
) -> list[Request]:
    """`build_traffic` of a single-turn workload: its requests, all known in advance."""
    traffic = build_traffic(
        config, workload, num_prompts, seed, request_rate, burstiness, **workload_params
    )
    if isinstance(traffic, ClosedLoopSessions):
        raise WorkloadError(
            f"workload={workload!r}: multi-turn sessions are closed loop; their later turns "
            "are made as earlier ones finish (build_traffic)"
        )
    return traffic


def load_dict(
    workload: str,
    num_prompts: int,
    seed: int,
    request_rate: float | None,
    burstiness: float = 1.0,
    **workload_params: Any,
) -> dict[str, Any]:
    """The load of a run as stored with it (`LoadSpec`'s names; rate "inf" as a string)."""
    rate = "inf" if request_rate is not None and math.isinf(request_rate) else request_rate
    return {
        "workload": workload,
        "num_prompts": num_prompts,
        "seed": seed,
        "request_rate": rate,
        "burstiness": burstiness,
        **{k: v for k, v in workload_params.items() if v is not None},
    }


def load_args(load: dict[str, Any]) -> tuple[float, float, dict[str, Any]]:
    """(request rate, burstiness, workload parameters) of a stored load (`load_dict`'s form:
    rate "inf" as a string)."""
    rate = math.inf if load["request_rate"] == "inf" else load["request_rate"]
    params = {
        k: v
        for k, v in load.items()
        if k not in ("workload", "num_prompts", "seed", "request_rate", "burstiness")
    }
    return rate, load.get("burstiness", 1.0), params


def real_run_config(doc: dict[str, Any]) -> EngineConfig:
    """The engine config of a stored real run, over the KV cache the GPU measured."""
    cfg_fields = dict(doc["engine_config"])
    cfg_fields["num_gpu_blocks_override"] = doc["result"]["num_gpu_blocks"]
    return EngineConfig(**cfg_fields)


def save_real_run(
    path: str | Path,
    *,
    config: EngineConfig,
    load: dict[str, Any],
    result: dict[str, Any],
    records: dict[str, Any],
    device: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write one real run: engine config (with the measured block count), load, result keys,
    raw records and the device it ran on; compressed when `path` ends in .xz or .gz."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": REAL_RUN_FORMAT,
        "backend": "pagesim-gpu",
        "load": load,
        "engine_config": {f.name: getattr(config, f.name) for f in fields(config)},
        "device": device,
        "result": _jsonable(result),
        "records": round_floats(records, RECORD_DECIMALS),
        "extra": extra or {},
    }
    write_json_file(path, doc)
    return path


def serve_workload(
    config: EngineConfig,
    model,
    num_gpu_blocks: int,
    load: dict[str, Any],
    *,
    device: str = "cuda",
    max_wall_s: float | None = None,
    temperature: float = 1.0,
    cuda_graphs: bool = True,
    log=None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serve `load` for real (wall clock) with `model` (a `RandomWeightDecoder`) over a KV
    cache of `num_gpu_blocks`; returns (result keys, raw records).

    With `cuda_graphs` (CUDA only) every graph the run can meet (decode batches up to the
    number of requests, every mixed-step size) is captured before the clock starts, and a
    few eager steps warm up the larger shapes (`serve.warm_up`); `gpu_graph_capture_s` and
    `gpu_graphs_captured` in the result say what it cost. The
    runner's per-step records (graph replayed or eager, device times) go under
    `records["runner_steps"]`."""
    from pagesim.gpu.modes import RUNNER_MODES
    from pagesim.gpu.runner import GPUModelRunner, RunnerConfig, step_record_columns
    from pagesim.gpu.serve import make_engine, replay, run_records, serve_result, warm_up

    rate, burstiness, params = load_args(load)
    traffic = build_traffic(
        config, load["workload"], load["num_prompts"], load["seed"], rate, burstiness, **params
    )
    # at most one request of a session is in flight at a time
    in_flight = traffic.num_sessions if isinstance(traffic, ClosedLoopSessions) else len(traffic)
    model.set_block_size(config.block_size)
    scheduler = make_engine(config, num_gpu_blocks)
    num_cpu = scheduler.swap_pool.num_blocks if scheduler.swap_pool is not None else 0
    options = RunnerConfig(
        device=device, num_cpu_blocks=num_cpu, temperature=temperature, cuda_graphs=cuda_graphs
    )
    runner = GPUModelRunner(config, num_gpu_blocks, options, model=model, log=log)
    graphs = runner.graphs
    captured, capture_s = (
        graphs.capture_all(max_batch=in_flight) if graphs is not None else (0, 0.0)
    )
    warm_up(runner, config)
    run = replay(traffic, scheduler, runner, max_wall_s=max_wall_s)
    result = serve_result(run, scheduler, config)
    result["gpu_cuda_graphs"] = graphs is not None and graphs.failed is None
    result["gpu_graphs_captured"] = captured
    result["gpu_graph_capture_s"] = capture_s
    result["gpu_graph_error"] = graphs.failed if graphs is not None else None
    result["gpu_runner"] = RUNNER_MODES[result["gpu_cuda_graphs"]]
    result["truncated"] = any(
        r.reject_reason == "wall-clock limit" for r in run.metrics.records.values()
    )
    records = run_records(run)
    records["runner_steps"] = step_record_columns(runner.step_records)
    del runner, graphs
    return result, records


def write_json_file(path: Path, doc: Any) -> None:
    """Compact JSON, compressed when the name ends in .xz or .gz (gzip without a timestamp:
    the same document gives the same bytes)."""
    raw = (json.dumps(doc, separators=(",", ":")) + "\n").encode("utf-8")
    if path.suffix == ".xz":
        raw = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    elif path.suffix == ".gz":
        raw = gzip.compress(raw, mtime=0)
    path.write_bytes(raw)


def read_json_file(path: Path) -> Any:
    """A JSON document, decompressed first when its name ends in .xz or .gz."""
    raw = path.read_bytes()
    if path.suffix == ".xz":
        raw = lzma.decompress(raw)
    elif path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def real_run_files(folder: str | Path) -> list[Path]:
    """The stored real runs in `folder`, sorted by name: compressed runs by their suffix,
    plain JSON files only if they open as `save_real_run` writes them (a GPU call's folder
    also holds its `summary.json` and `graph_vs_eager.json`)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file()
        and (
            p.name.endswith(COMPRESSED_RUN_SUFFIXES)
            or (p.name.endswith(".json") and _opens_as_run(p))
        )
    )


def _opens_as_run(path: Path) -> bool:
    """Whether a plain JSON file begins as `save_real_run` begins every run."""
    with open(path, "rb") as fh:
        return fh.read(len(_RUN_HEAD)) == _RUN_HEAD


def read_real_run(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"real run {str(p)!r}: no such file")
    try:
        doc = read_json_file(p)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError, EOFError, lzma.LZMAError) as e:
        raise ConfigError(f"real run {str(p)!r}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"real run {str(p)!r}: expected a JSON object, not {type(doc).__name__}")
    if doc.get("format") != REAL_RUN_FORMAT:
        raise ConfigError(
            f"real run {str(p)!r}: format={doc.get('format')!r} is not {REAL_RUN_FORMAT}"
        )
    return doc


def compare(
    real: dict[str, Any], predicted: dict[str, Any], targets: dict[str, float] = TARGETS_PCT
) -> list[dict[str, Any]]:
    """Per metric: real, predicted, error in % of real, target and whether it is met."""
    rows = []
    for key, target in targets.items():
        r, p = real.get(key), predicted.get(key)
        if r is None or p is None:
            continue
        err = 100.0 * (p - r) / r if r else (0.0 if p == r else math.inf)
        rows.append(
            {
                "metric": key,
                "real": r,
                "predicted": p,
                "error_pct": err,
                "target_pct": target,
                "met": abs(err) <= target,
            }
        )
    return rows


def simulate_like(
    real_doc: dict[str, Any], profile: str | Path | None, cost_model: CostModel | None = None
):
    """`simulate` with the real run's engine config (its measured KV blocks) and load;
    `cost_model` (optional) prices the steps in place of `profile`'s model."""
    from pagesim.sim.simulate import LoadSpec, simulate

    load = real_doc["load"]
    rate, burstiness, params = load_args(load)
    params = {
        k: params[k]
        for k in (
            "random_input_len",
            "random_output_len",
            "random_range_ratio",
            "random_prefix_len",
            "time_scale",
        )
        if k in params
    }
    spec = LoadSpec(
        workload=load["workload"],
        num_prompts=load["num_prompts"],
        request_rate=rate,
        burstiness=burstiness,
        seed=load["seed"],
        **params,
    )
    return simulate(real_run_config(real_doc), spec, profile=profile, cost_model=cost_model)


class TruncatedRunError(ConfigError):
    """A real run cut at its wall-clock limit: its metrics cover the requests that finished
    in time, a prediction covers them all, so the two do not compare."""


def traffic_key(doc: dict[str, Any], profile: str | Path | None) -> str:
    """What the prediction of a stored run depends on: its engine config (with the KV blocks
    the GPU measured), its load and the profile. Runs with one key are repeats of one run: the
    simulator, deterministic, predicts them alike, and their real values scatter."""
    cfg = {f.name: getattr(real_run_config(doc), f.name) for f in fields(EngineConfig)}
    text = json.dumps(
        {"engine": cfg, "load": doc["load"], "profile": None if profile is None else str(profile)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def validate_real_run(
    real_path: str | Path,
    profile: str | Path | None,
    predictions: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Simulate the traffic of a stored real run and compare; returns the report entry.
    Raises `TruncatedRunError` for a run cut at its wall-clock limit.

    `predictions` (optional), a dict kept across calls, holds each traffic's predicted result
    (`traffic_key`): repeats of one run are simulated once."""
    doc = read_real_run(real_path)
    if doc["result"].get("truncated"):
        raise TruncatedRunError(
            f"real run {str(real_path)!r} was cut at its wall-clock limit "
            f"({doc['result'].get('completed')} of {doc['load']['num_prompts']} requests "
            "finished): not compared"
        )
    key = traffic_key(doc, profile)
    predicted = None if predictions is None else predictions.get(key)
    if predicted is None:
        predicted = simulate_like(doc, profile).result
        if predictions is not None:
            predictions[key] = predicted
    cfg = doc["engine_config"]
    entry = {
        "run": Path(real_path).name.split(".")[0],
        "model": cfg["model"],
        "block_size": cfg["block_size"],
        "load": doc["load"],
        "num_gpu_blocks": doc["result"]["num_gpu_blocks"],
        "profile": str(profile) if profile is not None else None,
        "traffic": key,
        "rows": compare(doc["result"], predicted),
        "real": _jsonable(doc["result"]),
        "predicted": _jsonable(predicted),
        "device": doc.get("device", {}),
    }
    note = runner_mismatch(doc["result"].get("gpu_runner"), profile)
    if note:
        entry["runner_note"] = note
    return entry


def runner_mismatch(run_runner: str | None, profile: str | Path | None) -> str | None:
    """Why a profile may misprice a run: it was measured with another runner mode (whose
    host work per step differs), or None when both name the same mode or either names none
    (runs stored before they named theirs; the analytical model)."""
    if not run_runner or profile is None:
        return None
    from pagesim.cost.profile import Profile
    from pagesim.gpu.modes import profile_runner, runner_label

    measured = profile_runner(Profile.load_metadata(profile).attention_backend)
    if measured is None or measured == run_runner:
        return None
    return (
        f"the run's runner ({runner_label(run_runner)}) is not the one the profile "
        f"measured ({runner_label(measured)}): its host time per step differs"
    )


def round_floats(value: Any, decimals: int) -> Any:
    """`value` with every float inside its dicts and lists rounded to `decimals`."""
    if isinstance(value, float):
        return round(value, decimals)
    if isinstance(value, list):
        if value and all(type(v) is float for v in value):  # the common column: one pass
            return [round(v, decimals) for v in value]
        return [round_floats(v, decimals) for v in value]
    if isinstance(value, dict):
        return {k: round_floats(v, decimals) for k, v in value.items()}
    return value


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


# ---- the report -------------------------------------------------------------------------------
REPEATS_HEADING = (
    "Repeated runs: error % against the mean of the real runs "
    "(in brackets: their spread, max - min in % of the mean)"
)
REPEATS_MET_HEADING = (
    "Targets met against the repeats' mean (throughput, mean TPOT and mean E2E within "
    "max(3 %, half the repeats' spread); mean TTFT 5 %; P99 10 %)"
)
SUMMARY_METRICS: tuple[str, ...] = (
    "request_throughput",
    "output_throughput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
)


def report_markdown(entries: list[dict[str, Any]]) -> str:
    """One row per run: the error in % of each summary metric (`*` marks a missed target)."""
    return _error_table(entries, "prompts", lambda e: str(e["load"]["num_prompts"]), _error_cell)


def _error_cell(row: dict[str, Any]) -> str:
    return f"{row['error_pct']:+.1f}{'' if row['met'] else '*'}"


def _error_table(
    items: list[dict[str, Any]],
    count_head: str,
    count: Callable[[dict[str, Any]], str],
    cell: Callable[[dict[str, Any]], str],
) -> str:
    """A markdown table, one row per run (or group of runs): its name, model, block size,
    rate and `count`, then `cell` of each summary metric's comparison row."""
    head = ["run", "model", "bs", "rate", count_head] + [
        m.replace("_ms", "") for m in SUMMARY_METRICS
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for item in items:
        by = {r["metric"]: r for r in item["rows"]}
        cells = [
            item["run"],
            item["model"],
            str(item["block_size"]),
            str(item["load"]["request_rate"]),
            count(item),
        ]
        cells += ["n/a" if by.get(m) is None else cell(by[m]) for m in SUMMARY_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def base_run_name(run: str) -> str:
    """A run's name without its repeat suffix (`chat-85pct-bs16-r2`: chat-85pct-bs16 again)."""
    return re.sub(r"-r\d+$", "", run)


def repeat_groups(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The repeats among `entries` (two or more runs of one traffic key), each compared as one:
    the prediction against the mean of the real runs, beside the real runs' own spread.

    A single real run carries the GPU's speed at that moment: identical runs minutes apart
    differ by several % at high load, where queueing amplifies a step-time difference. The
    simulator predicts the expected run, so the mean of repeats is what it should meet; the
    spread (max - min, % of the mean) says how far apart the real side itself is."""
    by_key: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_key.setdefault(e.get("traffic", e["run"]), []).append(e)
    groups = []
    for members in by_key.values():
        if len(members) < 2:
            continue
        members = sorted(members, key=lambda e: e["run"])  # the same report in any order
        real_mean, spread = {}, {}
        for metric in REPEAT_TARGETS_PCT:
            values = [e["real"].get(metric) for e in members]
            if any(v is None for v in values):
                continue
            real_mean[metric] = sum(values) / len(values)
            spread[metric] = (
                100.0 * (max(values) - min(values)) / real_mean[metric]
                if real_mean[metric]
                else 0.0
            )
        rows = compare(real_mean, members[0]["predicted"], repeat_targets(spread))
        for row in rows:
            row["real_spread_pct"] = spread[row["metric"]]
            row["runs_met"] = sum(
                r["met"] for e in members for r in e["rows"] if r["metric"] == row["metric"]
            )
        first = members[0]
        groups.append(
            {
                "run": base_run_name(first["run"]),
                "runs": [e["run"] for e in members],
                "model": first["model"],
                "block_size": first["block_size"],
                "load": first["load"],
                "rows": rows,
            }
        )
    return groups


def repeat_targets(spread_pct: dict[str, float]) -> dict[str, float]:
    """The targets (|error| in %) of a load's repeats whose real runs spread `spread_pct`
    (metric -> max - min in % of their mean): `REPEAT_TARGETS_PCT`, the `SPREAD_WIDENED`
    metrics widened to half their spread. Metrics without a spread are not checked."""
    return {
        m: max(t, spread_pct[m] / 2.0) if m in SPREAD_WIDENED else t
        for m, t in REPEAT_TARGETS_PCT.items()
        if m in spread_pct
    }


def repeats_met_markdown(groups: list[dict[str, Any]]) -> str:
    """Which targets each repeated load met against its real runs' mean, and the total."""
    lines = ["| run | runs | met | missed (error %, target %) |", "| --- | --- | --- | --- |"]
    met = checked = 0
    for g in groups:
        missed = [r for r in g["rows"] if not r["met"]]
        met += len(g["rows"]) - len(missed)
        checked += len(g["rows"])
        cells = ", ".join(
            f"{r['metric'].replace('_ms', '')} {r['error_pct']:+.1f} ({r['target_pct']:.1f})"
            for r in missed
        )
        lines.append(
            f"| {g['run']} | {len(g['runs'])} | {len(g['rows']) - len(missed)}/{len(g['rows'])}"
            f" | {cells or '-'} |"
        )
    lines.append(f"| all | | {met}/{checked} | |")
    return "\n".join(lines)


def repeats_markdown(groups: list[dict[str, Any]]) -> str:
    """One row per repeated run: the error in % of each summary metric against the real runs'
    mean (`*` marks a missed target), and in brackets the real runs' spread in %."""
    return _error_table(
        groups,
        "runs",
        lambda g: str(len(g["runs"])),
        lambda r: f"{_error_cell(r)} ({r['real_spread_pct']:.1f})",
    )


def report_tables(entries: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None) -> str:
    """The report's text: the table of runs, then the repeats' table when there are repeats
    (`groups`: `repeat_groups(entries)`, made here when not given)."""
    groups = repeat_groups(entries) if groups is None else groups
    text = report_markdown(entries) + "\n"
    if groups:
        text += f"\n{REPEATS_HEADING}\n\n{repeats_markdown(groups)}\n"
        text += f"\n{REPEATS_MET_HEADING}\n\n{repeats_met_markdown(groups)}\n"
    return text


def write_report(
    entries: list[dict[str, Any]],
    out_dir: str | Path,
    name: str = "validation",
    skipped: tuple[str, ...] = (),
) -> dict[str, Path]:
    """`<name>.json` (every entry, real and predicted results), `<name>.md` and `<name>.png`;
    `skipped` (why a run was not compared) goes into both texts, so the report says what it
    left out, and so does each entry's `runner_note` (a profile of another runner mode)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json", "md": out / f"{name}.md", "png": out / f"{name}.png"}
    met = [r["met"] for e in entries for r in e["rows"]]
    doc = {
        "targets_pct": TARGETS_PCT,
        "num_runs": len(entries),
        "targets_met": sum(met),
        "targets_checked": len(met),
        "runs": entries,
    }
    groups = repeat_groups(entries)
    text = report_tables(entries, groups)
    if groups:
        group_met = [r["met"] for g in groups for r in g["rows"]]
        doc.update(
            repeat_groups=groups,
            repeat_targets_met=sum(group_met),
            repeat_targets_checked=len(group_met),
        )
    if skipped:
        doc["skipped"] = list(skipped)
    paths["json"].write_text(report_json(doc), encoding="utf-8")
    notes = "".join(f"\nskipped: {note}\n" for note in skipped) + "".join(
        f"\nwarning: {e['run']}: {e['runner_note']}\n" for e in entries if "runner_note" in e
    )
    paths["md"].write_text(text + notes, encoding="utf-8")
    plot_errors(entries, paths["png"])
    return paths


def report_json(doc: dict[str, Any]) -> str:
    """A report as stored: compact, keys sorted, floats to `REPORT_DECIMALS` (1 ns on a value in
    ms, far below a run's own spread). The GPU calls' reports number in the hundreds, and
    indentation and noise digits made up a third of their bytes."""
    return (
        json.dumps(round_floats(doc, REPORT_DECIMALS), separators=(",", ":"), sort_keys=True) + "\n"
    )


def plot_errors(entries: list[dict[str, Any]], path: str | Path) -> None:
    """Grouped bars: error % per summary metric, one bar per run, target bands shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = list(SUMMARY_METRICS)
    n = max(1, len(entries))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(metrics)), 4.5))
    for j, m in enumerate(metrics):
        t = TARGETS_PCT[m]
        ax.fill_between([j - 0.45, j + 0.45], -t, t, color="0.9", zorder=0)
    for i, e in enumerate(entries):
        by = {r["metric"]: r["error_pct"] for r in e["rows"]}
        xs = [j - 0.4 + (i + 0.5) * width for j in range(len(metrics))]
        ys = [max(-60.0, min(60.0, by.get(m, 0.0))) for m in metrics]
        rate = e["load"]["request_rate"]
        arrivals = "its own arrivals" if rate is None else f"{rate} req/s"
        ax.bar(
            xs,
            ys,
            width,
            color=plt.cm.tab20(i % 20),
            label=f"{e['model']} bs{e['block_size']} {e['load']['workload']} @ {arrivals}",
        )
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels([m.replace("_ms", "") for m in metrics], rotation=30, ha="right")
    ax.set_ylabel("predicted vs real, % (clipped at ±60)")
    ax.set_title("pagesim simulator vs real GPU runs (grey: target band)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
