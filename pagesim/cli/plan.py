"""`pagesim plan`: max request rate within SLOs, replicas for a target rate, KV sizing.

pagesim plan --workload chat --slo p99_ttft_ms<=500 --slo p99_tpot_ms<=50
pagesim plan ... --target-rate 40 --router prefix-aware      # + replicas needed
pagesim plan ... --target-rate 6 --kv-sizing                 # smallest KV cache at 6 req/s
pagesim plan --model llama-3-70b ... --target-rate 20 --compare-tp 2,4,8
                                          # a plan per TP size; the fewest GPUs wins
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pagesim.cli import options as o
from pagesim.cli.app import app
from pagesim.config import EngineConfig
from pagesim.cost.corrections import enabled_corrections
from pagesim.cost.scaled import check_step_time_scale
from pagesim.errors import ConfigError
from pagesim.metrics.report import HEADLINE_METRICS
from pagesim.planning.blocksize import best_block_size, block_size_table, compare_block_sizes
from pagesim.planning.capacity import (
    DEFAULT_MIN_DURATION_S,
    CapacityResult,
    max_sustainable_rate,
    plan_load,
    replicas_for_rate,
)
from pagesim.planning.capacity_report import binding_slo, capacity_table
from pagesim.planning.kv_sizing import min_kv_memory
from pagesim.planning.router import ROUTERS, make_router
from pagesim.planning.slo import DEFAULT_ATTAINMENT, SLOSpec, parse_slos
from pagesim.sim.build import (
    band_cost_model,
    block_size_note,
    cost_model_line,
    default_profile,
    pricing_profile,
    profile_path,
    profile_record,
    scaled_cost_model,
    step_time_band,
)
from pagesim.sim.simulate import LoadSpec
from pagesim.specs import GiB
from pagesim.utils import (
    MAX_COUNT,
    atomic_write_text,
    check_number,
    check_output_file,
    make_output_dir,
    parse_int_list,
    readable,
)
from pagesim.workload import WORKLOAD_PARAMS

PLAN = "Plan"
T = TypeVar("T")
MAX_REPLICAS = 4096
MAX_MIN_DURATION_S = 86_400.0  # probes of a day of arrivals at most
DEFAULTS = {"workload": "chat", "num_prompts": 500}
plan_option = partial(o.panel_option, PLAN)
# `plan`'s --num-prompts: the requests of one probe, per replica
ProbeNumPrompts = Annotated[int | None, o.load_option("Requests per replica per probe [500]")]
SHOWN = (
    *HEADLINE_METRICS,
    "p99_e2el_ms",
    "kv_cache_usage_mean",
    "prefix_cache_hit_rate",
    "num_preemptions",
)


@dataclass(frozen=True)
class _Search:
    """What every search of one plan shares: the load and SLOs, the search's precision, the
    replica settings and how steps are priced."""

    load: LoadSpec
    slos: SLOSpec
    rel_tol: float
    min_duration: float
    target_rate: float | None
    router: str
    max_replicas: int
    analytical: bool
    scale: float
    disabled_corrections: tuple[str, ...]

    def run(self, search: Callable[..., T], engine, prof, *args: Any, **kwargs: Any) -> T:
        """`search` (a `pagesim.planning` search) of `engine` priced by `prof`, over this
        plan's load and SLOs at its precision; `args` and `kwargs` are the search's own."""
        return search(
            engine,
            self.load,
            self.slos,
            *args,
            profile=prof,
            rel_tol=self.rel_tol,
            min_duration_s=self.min_duration,
            **kwargs,
        )

    def max_rate(self, engine, prof, cost, near: float | None = None) -> CapacityResult:
        return self.run(max_sustainable_rate, engine, prof, cost_model=cost, near=near)


@app.command("plan")
@o.with_options(
    o.pricing_options,
    o.engine_options,
    o.load_options,
    omit=("request_rate", "goodput", "percentile_metrics"),
    override={"num_prompts": ProbeNumPrompts},
)
def plan_command(
    slo: Annotated[
        list[str] | None,
        plan_option(
            "Objective, repeatable: p99_ttft_ms<=500, mean_tpot_ms<50, or vllm bench goodput "
            "items ttft:500 tpot:50"
        ),
    ] = None,
    slo_attainment: Annotated[
        float, plan_option("Share of requests that must meet goodput items")
    ] = DEFAULT_ATTAINMENT,
    allow_rejected: Annotated[
        bool,
        plan_option(
            "Plan for the served requests when some are rejected (too long for "
            "max_model_len); without it, a rate that rejects requests is not sustainable"
        ),
    ] = False,
    target_rate: Annotated[
        float | None, plan_option("req/s the service must sustain: adds replicas needed")
    ] = None,
    router: Annotated[str, plan_option(" | ".join(ROUTERS))] = "round-robin",
    max_replicas: Annotated[int, plan_option()] = 64,
    kv_sizing: Annotated[
        bool, plan_option("Smallest KV memory meeting the SLOs at --target-rate")
    ] = False,
    rel_tol: Annotated[float, plan_option("Bisection stops within this relative gap")] = 0.025,
    min_duration: Annotated[
        float,
        plan_option("Each probe sends requests for at least this many seconds (steady state)"),
    ] = DEFAULT_MIN_DURATION_S,
    save_result: Annotated[Path | None, plan_option("Write the plan as JSON here")] = None,
    compare_tp: Annotated[
        str | None,
        plan_option(
            "Comma list of tensor-parallel sizes, e.g. 2,4,8: a plan for each, then the "
            "fewest GPUs for --target-rate (without it, the most req/s per GPU)"
        ),
    ] = None,
    compare_block_sizes: Annotated[
        str | None,
        plan_option(
            "Comma list of block sizes, e.g. 8,16,32,64,128: the max rate within the SLOs "
            "for each at the same KV memory, with the kernel's step cost, internal "
            "fragmentation and prefix hits behind it, then the best block size"
        ),
    ] = None,
    analytical: Annotated[
        bool,
        plan_option(
            "Price every plan with the analytical model, shipped profiles ignored (puts "
            "--compare-tp sizes on one footing when only some have a profile)"
        ),
    ] = False,
    band: Annotated[
        bool,
        plan_option(
            "Also search at the ends of the profile's measured spread of GPU speed and "
            "print the range of the rate within the SLOs"
        ),
    ] = True,
    config: o.ConfigFile = None,
    **flags: Any,
) -> None:
    """Find the highest request rate within SLOs; with --target-rate, the replicas it needs."""
    scale = check_step_time_scale(flags.pop("step_time_scale"))
    off = tuple(flags.pop("disable_correction") or ())
    enabled_corrections(off)  # an unknown name fails before any output
    _check_plan_numbers(slo_attainment, target_rate, max_replicas, rel_tol, min_duration)
    if save_result is not None:  # before the search: a bad path must not cost the plan
        check_output_file(save_result, "--save-result")
    values = o.merge({**DEFAULTS, **o.read_config_file(config)}, flags)
    slos = parse_slos(slo, attainment=slo_attainment, allow_rejected=allow_rejected)
    if slos.empty:
        raise ConfigError("--slo: give at least one objective, e.g. --slo p99_ttft_ms<=500")
    if kv_sizing and target_rate is None:
        raise ConfigError("--kv-sizing needs --target-rate")
    make_router(router)  # an unknown name fails before any simulation
    if analytical and values.get("profile") is not None:
        raise ConfigError("--analytical prices with the analytical model: drop --profile")
    if analytical and off:
        raise ConfigError("--analytical: the analytical model has no corrections to disable")
    sizes = _tp_sizes(compare_tp, values, kv_sizing)
    engine, load = o.engine_config(values), o.load_spec(values)
    if save_result is not None:  # its folder, made once the settings are known good
        make_output_dir(save_result.parent, "--save-result", shown=save_result)
    print(
        f"Plan for {engine.model} on {engine.gpu}, workload {load.workload}, "
        f"probes of >= {load.num_prompts} requests and >= {min_duration:g} s of arrivals; "
        f"SLO: {slos}"
    )
    plan = _Search(
        load, slos, rel_tol, min_duration, target_rate, router, max_replicas, analytical, scale, off
    )
    doc: dict[str, Any] = {
        "model": engine.model,
        "gpu": engine.gpu,
        "workload": load.workload,
        "slo": str(slos),
    }
    if scale != 1.0:
        doc["step_time_scale"] = scale
    if off:
        doc["disabled_corrections"] = list(off)
    if compare_block_sizes is not None:
        doc["compare_block_sizes"] = _plan_block_sizes(
            compare_block_sizes, values, sizes, kv_sizing, engine, plan
        )
        doc["best"] = best_block_size(doc["compare_block_sizes"])
    elif sizes:
        doc["compare_tp"] = [_plan_tp(values, tp, plan) for tp in sizes]
        if all("error" in e for e in doc["compare_tp"]):  # an impossible config, not a plan
            raise ConfigError(
                f"--compare-tp {compare_tp}: no size can be built: {doc['compare_tp'][0]['error']}"
            )
        doc["best"] = _best(doc["compare_tp"], target_rate)
    else:
        prof = None if analytical else values.get("profile") or default_profile(engine)
        cost = _priced(engine, prof, plan)  # before the line: a refusal comes alone
        print(_cost_line(engine, prof, plan))
        doc["profile"] = profile_record(pricing_profile(engine, prof, not analytical))
        if kv_sizing:
            doc["kv_sizing"] = _kv(engine, plan, prof, cost)
        else:
            cap = plan.max_rate(engine, prof, cost)
            doc["capacity"] = _capacity(cap, load.num_prompts)
            ends = step_time_band(engine, prof, not analytical) if band else None
            if ends is not None and cap.max_rate is not None:
                doc["capacity"]["band"] = _band(engine, plan, prof, cap, ends.scaled(scale))
            if target_rate is not None:
                doc["replicas"] = _replicas(engine, plan, prof, cap, cost)
    if save_result is not None:
        atomic_write_text(save_result, json.dumps(doc, indent=2, default=str) + "\n")
        print(f"Saved plan to {save_result}")


def _check_plan_numbers(
    attainment: float,
    target_rate: float | None,
    max_replicas: int,
    rel_tol: float,
    min_duration: float,
) -> None:
    check_number("--slo-attainment", attainment, low=0, low_open=True, high=1)
    check_number("--min-duration", min_duration, low=0, high=MAX_MIN_DURATION_S)
    if target_rate is not None:
        check_number("--target-rate", target_rate, low=0, low_open=True)
        # A probe at the target sends target x --min-duration requests (`plan_load`); one
        # run holds MAX_COUNT. A second of arrivals is the least counted, so that a shorter
        # --min-duration cannot let through a rate whose replica estimate has 300 digits.
        seconds = max(min_duration, 1.0)
        if target_rate * seconds > MAX_COUNT:
            raise ConfigError(
                f"--target-rate {target_rate:g}: too large: {seconds:g} s of arrivals at it "
                f"(--min-duration, at least 1 s) exceed the {MAX_COUNT:,} requests one run "
                f"holds; at most {math.floor(MAX_COUNT / seconds):,} req/s"
            )
    check_number("--max-replicas", max_replicas, integer=True, low=1, high=MAX_REPLICAS)
    check_number("--rel-tol", rel_tol, low=0, low_open=True, high=1)


def _cost_line(engine, prof, plan: _Search) -> str:
    """What prices this plan's steps (`cost_model_line`), and the block-size note if any."""
    note = block_size_note(prof, engine.block_size) if prof is not None else None
    line = cost_model_line(
        engine,
        prof,
        analytical=plan.analytical,
        step_time_scale=plan.scale,
        disabled_corrections=plan.disabled_corrections,
    )
    return line + (f"\n{note}" if note else "")


def _priced(engine, prof, plan: _Search):
    """The model pricing this plan's steps at the center of its band (`scaled_cost_model`)."""
    return scaled_cost_model(
        engine, prof, plan.scale, not plan.analytical, plan.disabled_corrections
    )


def _plan_block_sizes(
    text, values, tp_sizes, kv_sizing, engine, plan: _Search
) -> list[dict[str, Any]]:
    """`--compare-block-sizes`: one capacity search per block size, printed as a table."""
    sizes = sorted(set(parse_int_list(text, "compare-block-sizes")))
    for clash, given in (
        ("--block-size", values.get("block_size")),
        ("--compare-tp", tp_sizes or None),
        ("--kv-sizing", kv_sizing or None),
    ):
        if given is not None:
            raise ConfigError(f"--compare-block-sizes sets each plan's block size: drop {clash}")
    prof = None if plan.analytical else values.get("profile") or default_profile(engine)
    print(_cost_line(engine, prof, plan).splitlines()[0])
    rows = plan.run(
        compare_block_sizes,
        engine,
        prof,
        sizes,
        step_time_scale=plan.scale,
        disabled_corrections=plan.disabled_corrections,
        transfer=not plan.analytical,
    )
    profiled = pricing_profile(engine, prof, not plan.analytical) is not None
    print("\n".join(block_size_table(rows, profiled=profiled, rel_tol=plan.rel_tol)))
    return rows


def _tp_sizes(compare_tp: str | None, values: dict[str, Any], kv_sizing: bool) -> list[int]:
    """The sizes `--compare-tp` asks for ([] without it); bad combinations are one line."""
    if compare_tp is None:
        return []
    try:
        sizes = [int(x) for x in compare_tp.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--compare-tp {compare_tp!r}: expected a comma list of integers, e.g. 2,4,8"
        ) from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise ConfigError(f"--compare-tp {compare_tp!r}: give distinct sizes >= 1, e.g. 2,4,8")
    for clash, given in (
        ("--tensor-parallel-size", values.get("tensor_parallel_size")),
        ("--profile", values.get("profile")),
        ("--kv-sizing", kv_sizing or None),
    ):
        if given is not None:
            raise ConfigError(
                f"--compare-tp sets each plan's TP size and picks its profile: drop {clash}"
            )
    return sorted(sizes)


def _plan_tp(values, tp, plan: _Search) -> dict[str, Any]:
    """One TP size's plan, printed as a single-size plan is; a size whose engine cannot be
    built (the weights do not fit, the heads do not divide) is reported and skipped."""
    print(f"\n=== tensor_parallel_size {tp} ===")
    try:
        engine = o.engine_config({**values, "tensor_parallel_size": tp})
        prof = None if plan.analytical else default_profile(engine)
        cost = _priced(engine, prof, plan)
        print(_cost_line(engine, prof, plan))
        cap = plan.max_rate(engine, prof, cost)
    except ConfigError as e:
        print(f"Not possible: {e}")
        return {"tp": tp, "error": str(e)}
    entry: dict[str, Any] = {
        "tp": tp,
        "cost_model": _cost_name(engine, prof, plan.analytical),
        "capacity": _capacity(cap, plan.load.num_prompts),
    }
    if plan.target_rate is not None and cap.max_rate is not None:
        entry["replicas"] = _replicas(engine, plan, prof, cap, cost)
    return entry


def _best(entries: list[dict[str, Any]], target_rate: float | None) -> dict[str, Any] | None:
    """The summary table, and the winner: the fewest GPUs for the target rate (ties: the
    higher rate per replica), or without a target the most req/s per GPU."""
    print(
        "\nTP  max req/s per replica  req/s per GPU"
        + ("  replicas  GPUs" if target_rate is not None else "")
        + "  costs"
    )
    rows = []
    for e in entries:
        rate = None if "error" in e else e["capacity"]["max_rate"]
        if rate is None:
            print(
                f"{e['tp']:2d}  {'-':>21}  {'-':>13}  " + (e.get("error", "no rate meets the SLOs"))
            )
            continue
        n = (e.get("replicas") or {}).get("num_replicas")
        row = {
            "tp": e["tp"],
            "max_rate": rate,
            "rate_per_gpu": rate / e["tp"],
            "num_replicas": n,
            "gpus": None if n is None else n * e["tp"],
        }
        rows.append(row)
        line = f"{e['tp']:2d}  {rate:21.3f}  {row['rate_per_gpu']:13.3f}"
        if target_rate is not None:
            line += f"  {'-' if n is None else n:>8}  {'-' if n is None else row['gpus']:>4}"
        print(f"{line}  {_costs(e['cost_model'])}")
    kinds = {_costs(e["cost_model"]) for e in entries if "error" not in e}
    if len(kinds) > 1:
        print(
            "Note: the sizes are priced by different cost models; the analytical one, "
            "fitted to measured H200 profiles, is within -7 to +14 % of their steps at the "
            "median by model and kind, -32 to +23 % at worst "
            "(results/analytical_vs_measured.csv). --analytical puts them on one footing"
        )
    if target_rate is not None:
        rows = [r for r in rows if r["gpus"] is not None]
    if not rows:
        at = "" if target_rate is None else f" at {target_rate:g} req/s"
        print(f"No TP size meets the SLOs{at}")
        return None
    if target_rate is not None:
        best = min(rows, key=lambda r: (r["gpus"], -r["max_rate"]))
        print(
            f"Fewest GPUs for {target_rate:g} req/s: tensor_parallel_size {best['tp']} x "
            f"{best['num_replicas']} replicas = {best['gpus']} GPUs"
        )
    else:
        best = max(rows, key=lambda r: (r["rate_per_gpu"], -r["tp"]))
        print(
            f"Most req/s per GPU: tensor_parallel_size {best['tp']} "
            f"({best['rate_per_gpu']:.3f} req/s per GPU)"
        )
    return best


def _cost_name(engine, prof, analytical: bool) -> str:
    """A plan entry's cost model: the profile's path, `transfer:<path>`, or `analytical`."""
    source = pricing_profile(engine, prof, transfer=not analytical)
    if source is None:
        return "analytical"
    return profile_path(source) if prof is not None else f"transfer:{profile_path(source)}"


def _costs(cost_model: str) -> str:
    if cost_model.startswith("transfer:"):
        return "transfer"
    return "analytical" if cost_model == "analytical" else "calibrated"


def _metrics_lines(result: dict[str, Any] | None) -> list[str]:
    if not result:
        return []
    return [
        f"  {k:<28} {readable(result[k])}" for k in SHOWN if isinstance(result.get(k), int | float)
    ]


def _verdict(probe, detail: str = "") -> str:
    """A probe's printed outcome: pass or FAIL, then `detail` and the SLOs it violated."""
    return f"{'pass' if probe.passed else 'FAIL'}  {detail}" + "; ".join(probe.violations)


def _capacity(cap: CapacityResult, num_prompts: int) -> dict[str, Any]:
    for p in cap.probes:
        print(f"  rate {p.value:9.3f} req/s  {_verdict(p)}")
    print("\n".join(capacity_table(cap, num_prompts)))
    if cap.max_rate is not None:
        print("\n".join(_metrics_lines(cap.result)))
    return {
        "max_rate": cap.max_rate,
        "first_failing_rate": cap.first_failing_rate,
        "saturated_throughput": cap.saturated_throughput,
        "binding_slo": binding_slo(cap),
        "refused": cap.refused,
        "probes": [
            {"rate": p.value, "passed": p.passed, "violations": list(p.violations)}
            for p in cap.probes
        ],
        "result": _slim(cap.result),
    }


def _band(engine, plan: _Search, prof, cap, ends) -> dict[str, Any]:
    """The rate within the SLOs at the band's two ends, each searched from the center's rate
    over the factor (a step time x f slower serves about 1/f the rate), and the printed line."""
    rates = [cap.max_rate]
    for factor in (ends.low, ends.high):
        priced = band_cost_model(
            engine, prof, factor, not plan.analytical, plan.disabled_corrections
        )
        end = plan.max_rate(engine, prof, priced, near=cap.max_rate / factor)
        rates.append(end.max_rate)
    known = [r for r in rates if r is not None]
    low = None if None in rates else min(known)
    shown = "none" if low is None else f"{low:.3f}"
    print(
        f"Rate within SLOs: {cap.max_rate:.3f} req/s ({shown}-{max(known):.3f} across "
        f"{ends.basis}, every step x {ends.low:.3f}-{ends.high:.3f})"
    )
    return {**ends.to_json(), "max_rate": [low, max(known)]}


def _replicas(engine, search, prof, cap, cost):
    target_rate, router, max_replicas = search.target_rate, search.router, search.max_replicas
    plan = search.run(
        replicas_for_rate,
        engine,
        prof,
        target_rate,
        router=router,
        per_replica=cap,
        max_replicas=max_replicas,
        cost_model=cost,
    )
    print(
        f"Replicas for {target_rate:g} req/s behind {router}: estimate {plan.estimate} "
        "from per-replica capacity, checked by simulation:"
    )
    for p in plan.probes:
        hit = p.result.get("prefix_cache_hit_rate", 0.0)
        print(f"  {int(p.value):3d} replicas  {_verdict(p, f'prefix hit {hit:.3f}  ')}")
    if plan.num_replicas is None:
        print(f"Even {max_replicas} replicas miss the SLOs")
    else:
        gpus = plan.num_replicas * engine.tensor_parallel_size
        print(f"Replicas needed: {plan.num_replicas} ({gpus} GPUs)")
    return {
        "target_rate": target_rate,
        "router": router,
        "estimate": plan.estimate,
        "num_replicas": plan.num_replicas,
        "probes": [
            {"num_replicas": int(p.value), "passed": p.passed, "violations": list(p.violations)}
            for p in plan.probes
        ],
        "result": _slim(plan.result),
    }


def _kv(engine, plan, prof, cost):
    target_rate = plan.target_rate
    k = plan.run(min_kv_memory, engine, prof, target_rate, cost_model=cost)
    for p in k.probes:
        print(f"  {int(p.value):7d} blocks  {_verdict(p)}")
    if k.num_gpu_blocks is None:
        print(
            f"Even the largest KV cache ({k.max_num_gpu_blocks} blocks) misses the SLOs "
            f"at {target_rate:g} req/s"
        )
    else:
        util = "n/a" if k.gpu_memory_utilization is None else f"{k.gpu_memory_utilization:.3f}"
        print(
            f"Smallest KV cache at {target_rate:g} req/s: {k.num_gpu_blocks} blocks = "
            f"{k.kv_cache_memory_bytes / GiB:.2f} GiB (--kv-cache-memory-bytes "
            f"{k.kv_cache_memory_bytes}), --gpu-memory-utilization {util}"
        )
        print("Check it: " + _run_command(engine, plan, k))
        print("\n".join(_metrics_lines(k.result)))
    # every field of the sizing in its order, the probes left out (printed above)
    doc = {f.name: getattr(k, f.name) for f in dataclasses.fields(k) if f.name != "probes"}
    return {**doc, "result": _slim(k.result)}


def _run_command(engine, plan, k) -> str:
    """The `pagesim run` that serves the plan's probe load on the KV cache found: every
    engine setting that differs from the defaults for this model and GPU, every load setting
    given, the probe's request count and the corrections left off."""
    base = EngineConfig.create(
        model=engine.model, gpu=engine.gpu, tensor_parallel_size=engine.tensor_parallel_size
    )
    flags = {"model": engine.model, "gpu": engine.gpu}
    for f in dataclasses.fields(engine):
        value = getattr(engine, f.name)
        if f.name not in ("kv_cache_memory_bytes", "num_gpu_blocks_override", "model", "gpu"):
            if value != getattr(base, f.name):
                flags[f.name] = value
    target_rate = plan.target_rate
    probe = plan_load(plan.load, plan.slos, target_rate, min_duration_s=plan.min_duration)
    for name in ("workload", "burstiness", "max_concurrency", "seed", *WORKLOAD_PARAMS):
        value = getattr(probe, name)
        if value is not None and value != getattr(LoadSpec(), name):
            flags[name] = value
    flags |= {"num_prompts": probe.num_prompts, "request_rate": f"{target_rate:g}"}
    flags["kv_cache_memory_bytes"] = k.kv_cache_memory_bytes
    parts = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            parts.append(f"{flag} {value}")
    parts += [f"--disable-correction {name}" for name in plan.disabled_corrections]
    return "pagesim run " + " ".join(parts)


def _slim(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {
        k: ("inf" if isinstance(v, float) and math.isinf(v) else v)
        for k, v in result.items()
        if k != "engine_config"
    }
