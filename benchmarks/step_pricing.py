"""Per-step evidence for how CalibratedCostModel prices the CUDA-graph runs' steps.

The real runs (results/validation/decode_graphs/real/llama-2-7b/*.json.xz) keep per-step sums only; each
step's members are rebuilt from the request records (no preemptions: a request runs in every
step from its first scheduled one to the one its finish falls in; its decode steps are the last
num_output_tokens - 1 of them; prefill chunks are solved from the step's prefill-token total),
and checked against `runner_steps` (decode count and context sum must match exactly).

Decode (graph) steps are priced under several hypotheses (device time: the model's step time
minus its host-overhead term, against the runner's `wall_s`); prefill/mixed (eager) steps by
the model with exact entries, with and without the cached prefix.

    python benchmarks/step_pricing.py   -> results/validation/decode_graphs/step_pricing.md
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np

from pagesim.cost.base import BatchShape
from pagesim.cost.calibrated import CalibratedCostModel
from pagesim.cost.profile import Profile
from pagesim.validate import read_json_file, real_run_files

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "results" / "validation" / "decode_graphs"
REAL = GEN / "real" / "llama-2-7b"
PROFILE = GEN / "profile" / "h200" / "llama-2-7b"
OUT = GEN / "step_pricing.md"


def rebuild(doc: dict):
    """Per step: decode contexts, and prefill entries [(new, context)] (None: unsolvable)."""
    rs, start = doc["records"]["runner_steps"], doc["records"]["steps"]["start_s"]
    n, reqs = len(start), doc["records"]["requests"]
    dec: list[list[int]] = [[] for _ in range(n)]
    pre: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for k, r in enumerate(reqs):
        if r["first_scheduled_time"] is None or r["finish_time"] is None:
            continue
        assert r["num_preemptions"] == 0
        s0 = bisect_left(start, r["first_scheduled_time"] - 1e-9)
        s1 = bisect_right(start, r["finish_time"] - 1e-9) - 1
        no, p = r["num_output_tokens"], r["num_prompt_tokens"]
        npre = (s1 - s0 + 1) - (no - 1)
        for s in range(s0, s1 + 1):
            if s - s0 < npre:
                pre[s].append((k, s - s0 == npre - 1))
            else:
                dec[s].append(p + no - 2 - (s1 - s))
    done: dict[int, int | None] = {}
    entries: list[list[tuple[int, int]] | None] = [None] * n
    for s in range(n):
        known, unknown = [], []
        for k, last in pre[s]:
            c = reqs[k]["num_cached_tokens"] + (done.get(k) or 0)
            (
                known.append((k, reqs[k]["num_prompt_tokens"] - c, c))
                if last
                else unknown.append((k, c))
            )
        rest = rs["num_prefill_tokens"][s] - sum(q for _, q, _ in known)
        ent = known + [(k, rest, c) for k, c in unknown]
        if (
            len(unknown) > 1
            or (not unknown and rest)
            or (unknown and rest <= 0)
            or any(k in done and done[k] is None for k, _, _ in ent)
        ):
            for k, _ in unknown:
                done[k] = None
            continue
        for k, q, _ in ent:
            done[k] = (done.get(k) or 0) + q
        entries[s] = [(q, c) for _, q, c in ent]
    for s in range(n):
        if rs["num_prefill_tokens"][s] == 0 and rs["num_reqs"][s]:
            assert len(dec[s]) == rs["num_decode_reqs"][s] and sum(dec[s]) == rs["context_sum"][s]
    return dec, entries


def main() -> None:
    prof = Profile.load(PROFILE)
    graphs = CalibratedCostModel(prof)
    eager = CalibratedCostModel(
        Profile(
            dataclasses.replace(prof.metadata, cuda_graph_sizes=[]),
            prof.decode,
            prof.prefill,
            prof.mixed,
            prof.overhead,
        )
    )
    pad = graphs.padded_batch
    dec_variants = {
        "true batch, mean context (before)": lambda n, c: (eager, n, sum(c) / n),
        "padded batch, mean context (now)": lambda n, c: (graphs, n, sum(c) / n),
        "padded batch, sum of contexts over padded rows": lambda n, c: (
            eager,
            pad(n),
            sum(c) / pad(n),
        ),
        "padded batch, longest context": lambda n, c: (eager, pad(n), max(c)),
        "true batch, longest context": lambda n, c: (eager, n, max(c)),
    }
    err: dict[str, dict[str, list[float]]] = {k: {} for k in dec_variants}
    pre_err: dict[str, dict[str, list[float]]] = {
        "with cached prefix": {},
        "cached prefix as 0": {},
    }
    for path in real_run_files(REAL):
        doc = read_json_file(path)
        rs, bs, run = (
            doc["records"]["runner_steps"],
            doc["engine_config"]["block_size"],
            path.name.split(".")[0],
        )
        dec, ent = rebuild(doc)
        for i, wall in enumerate(rs["wall_s"]):
            if rs["cuda_graph"][i]:
                for k, f in dec_variants.items():
                    cm, n, c = f(len(dec[i]), dec[i])
                    t = cm.device_time(BatchShape(bs, n, n, round(c * n), [round(c)] * n))
                    err[k].setdefault(run, []).append(100 * (t - wall) / wall)
            elif rs["num_prefill_tokens"][i] and ent[i] is not None:
                for k, zero in (("with cached prefix", False), ("cached prefix as 0", True)):
                    e = ent[i]
                    shape = BatchShape(
                        bs,
                        len(dec[i]) + sum(q for q, _ in e),
                        len(dec[i]),
                        sum(dec[i]),
                        dec[i],
                        [q for q, _ in e],
                        [0 if zero else c for _, c in e],
                    )
                    t = graphs.device_time(shape)
                    pre_err[k].setdefault(run, []).append(100 * (t - wall) / wall)
    runs = sorted(err["true batch, mean context (before)"])
    lines = [
        "Decode (CUDA-graph) steps: MAPE % / mean error % (> 0: predicted slow)",
        "",
        "| pricing | " + " | ".join(runs) + " | all |",
        "|" + " --- |" * (len(runs) + 2),
    ]
    for k, by in err.items():
        every = [x for r in runs for x in by[r]]
        lines.append(
            f"| {k} | "
            + " | ".join(f"{np.mean(np.abs(by[r])):.1f} / {np.mean(by[r]):+.1f}" for r in runs)
            + f" | {np.mean(np.abs(every)):.2f} / {np.mean(every):+.2f} |"
        )
    lines.append("\nsteps: " + ", ".join(f"{r} {len(err[k][r])}" for r in runs))
    pruns = sorted(pre_err["with cached prefix"])
    lines += [
        "",
        "Prefill/mixed (eager) steps with exact entries: MAPE % / mean error %",
        "",
        "| pricing | " + " | ".join(pruns) + " |",
        "|" + " --- |" * (len(pruns) + 1),
    ]
    for k, by in pre_err.items():
        lines.append(
            f"| {k} | "
            + " | ".join(
                f"{np.mean(np.abs(by[r])):.1f} / {np.mean(by[r]):+.1f} (n={len(by[r])})"
                for r in pruns
            )
            + " |"
        )
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
