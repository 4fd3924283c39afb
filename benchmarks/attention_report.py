"""Markdown tables from the attention benchmark's rows (one per measured kernel and shape)."""

from __future__ import annotations

import statistics


def _f(x) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _fmt(x, spec=".1f") -> str:
    v = _f(x)
    return "-" if v is None else format(v, spec)


def _sdpa(rows, kind, key) -> dict[str, dict]:
    """SDPA rows of one shape, by backend name."""
    return {
        r["impl"].removeprefix("sdpa_"): r
        for r in rows
        if r["kind"] == kind and r["impl"].startswith("sdpa_") and _key(r) == key
    }


def _key(r) -> tuple:
    return (r["model"], r["dtype"], str(r["batch"]), str(r["context"]))


def _ratio(sdpa: dict[str, dict], t: float) -> str:
    times = [_f(r["time_us"]) for r in sdpa.values() if _f(r["time_us"])]
    return f"{min(times) / t:.2f}" if times else "-"


def decode_table(rows) -> list[str]:
    out = [
        "| model | dtype | batch | context | block | splits | Triton µs | KV GB/s | % copy BW "
        "| cuDNN µs | flash µs | GQA in SDPA | best SDPA / Triton |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] != "decode" or not r["impl"].startswith("triton"):
            continue
        sd = _sdpa(rows, "decode", _key(r))
        t = _f(r["time_us"])
        gqa = "/".join(sorted({s["gqa"] for s in sd.values()})) or "-"
        out.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['context']} | "
            f"{r['block_size']} | {r['impl'].removeprefix('triton_p')} | {t:.1f} | "
            f"{_fmt(r['kv_gbps'], '.0f')} | {_fmt(r['pct_copy_bw'])} | "
            f"{_fmt(sd.get('cudnn', {}).get('time_us'))} | "
            f"{_fmt(sd.get('flash', {}).get('time_us'))} | {gqa} | {_ratio(sd, t)} |"
        )
    return out


def prefill_table(rows) -> list[str]:
    out = [
        "| model | dtype | batch | context | block | Triton µs | Triton TFLOP/s | cuDNN µs "
        "| flash µs | best SDPA TFLOP/s | best SDPA / Triton |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] != "prefill" or r["impl"] != "triton":
            continue
        sd = _sdpa(rows, "prefill", _key(r))
        t = _f(r["time_us"])
        best = max((_f(s["tflops"]) or 0.0 for s in sd.values()), default=None)
        out.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['context']} | "
            f"{r['block_size']} | {t:.1f} | {_fmt(r['tflops'])} | "
            f"{_fmt(sd.get('cudnn', {}).get('time_us'))} | "
            f"{_fmt(sd.get('flash', {}).get('time_us'))} | {_fmt(best)} | "
            f"{_ratio(sd, t)} |"
        )
    return out


def alt_table(rows) -> list[str]:
    """Decode with the alternative config (`--decode-alt`) beside the default, per shape."""
    alt = {
        (_key(r), str(r["block_size"])): r
        for r in rows
        if r["kind"] == "decode" and r["impl"].startswith("alt_")
    }
    if not alt:
        return []
    out = [
        "## Decode, alternative config",
        "",
        "| model | dtype | batch | context | block | default splits | default µs "
        "| alt splits | alt µs | alt / default time |",
        "|---" * 10 + "|",
    ]
    for r in rows:
        a = alt.get((_key(r), str(r["block_size"])))
        if r["kind"] != "decode" or not r["impl"].startswith("triton") or a is None:
            continue
        t, ta = _f(r["time_us"]), _f(a["time_us"])
        out.append(
            f"| {r['model']} | {r['dtype']} | {r['batch']} | {r['context']} | "
            f"{r['block_size']} | {r['impl'].removeprefix('triton_p')} | {t:.1f} | "
            f"{a['impl'].removeprefix('alt_p')} | {ta:.1f} | {ta / t:.2f} |"
        )
    return out + [""]


def summary(rows) -> list[str]:
    dec = [r for r in rows if r["kind"] == "decode" and r["impl"].startswith("triton")]
    big = [_f(r["pct_copy_bw"]) for r in dec if int(r["batch"]) * int(r["context"]) >= 32 * 2048]
    lines = []
    if big:
        lines.append(
            f"- Decode with batch x context >= 65536 tokens: {min(big):.0f}-"
            f"{max(big):.0f}% of copy bandwidth (median {statistics.median(big):.0f}%, "
            f"{len(big)} shapes)."
        )
    for kind in ("decode", "prefill"):
        ratios = []
        for r in rows:
            if r["kind"] == kind and r["impl"].startswith("triton"):
                sd = _sdpa(rows, kind, _key(r))
                times = [_f(s["time_us"]) for s in sd.values() if _f(s["time_us"])]
                if times:
                    ratios.append(min(times) / _f(r["time_us"]))
        if ratios:
            lines.append(
                f"- {kind}: best-SDPA/Triton time ratio {min(ratios):.2f}-"
                f"{max(ratios):.2f} (median {statistics.median(ratios):.2f}; > 1 means "
                f"the paged Triton kernel is faster)."
            )
    return lines


def write_markdown(rows, env: dict[str, str], path: str) -> None:
    head = [
        f"# Paged attention on {env['gpu']}",
        "",
        f"GPU {env['gpu']} ({env['sms']} SMs, L2 {env['l2_mb']} MB), driver "
        f"{env['driver']}, CUDA {env['cuda']}, torch {env['torch']}, triton "
        f"{env['triton']}, {env['date']}. Measured device-to-device copy bandwidth "
        f"(bytes read + written): {env['copy_gbps']} GB/s.",
        "",
        "Times are medians of 10 CUDA-graph replays over rotated inputs (> 3x L2). "
        "Decode reads K and V once: `KV GB/s` = KV bytes / time; `% copy BW` compares that "
        "with the copy rate above. `splits` = context partitions per sequence chosen by "
        "the shape rule. SDPA runs on contiguous K/V; ratios are SDPA time / Triton time.",
        "",
        "## Summary",
        "",
        *summary(rows),
        "",
        "## Decode",
        "",
        *decode_table(rows),
        "",
        "## Prefill (causal, whole prompts)",
        "",
        *prefill_table(rows),
        "",
        *alt_table(rows),
    ]
    with open(path, "w") as f:
        f.write("\n".join(head))
