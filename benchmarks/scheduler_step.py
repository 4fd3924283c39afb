"""Cost of the scheduler's hot path: schedule() + update_from_output() per running request.

A ShareGPT-shaped stream (prompt and output lengths drawn, seeded, from sarathi-serve's
ShareGPT token-count trace, prompt + output capped at max_model_len; half of the prompts start
with one of 16 shared 512-token system prompts) arrives all at once and runs to completion
through `Scheduler` over the real `KVCacheManager`, with a runner that only emits synthetic
tokens (no cost model). max_num_seqs keeps 100-200 requests running.

Cases:
  roomy     the cache holds every running request: no preemption
  tight     a third of that cache: recompute preemptions, readmissions with prefix hits
  no-op-kv  roomy, with a manager whose methods do nothing: the scheduler's own cost

Columns: steps, request-steps (scheduled requests summed over steps), the mean running
requests per step, wall seconds in schedule() and in update_from_output(), and microseconds
per request-step over both calls, as wall time and as this process's CPU time (the two differ
when other processes share the cores).

Usage: python benchmarks/scheduler_step.py [--num-requests 10000] [--seed 0]
Writes results/scheduler_step.csv.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pagesim.config import EngineConfig  # noqa: E402
from pagesim.kvcache.kv_cache_manager import KVCacheManager  # noqa: E402
from pagesim.request import Request  # noqa: E402
from pagesim.scheduler import ModelRunnerOutput, Scheduler, synthetic_token  # noqa: E402

TRACE = (
    ROOT.parent
    / "shared"
    / "traces"
    / "microsoft-sarathi-serve"
    / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
)
MAX_MODEL_LEN = 4096
MAX_NUM_SEQS = 160
CASES = {"roomy": 40_000, "tight": 13_000, "no-op-kv": None}  # num_gpu_blocks (block 16)


def make_requests(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    data = np.genfromtxt(
        TRACE,
        delimiter=",",
        names=True,
        dtype=np.int64,
        usecols=("num_prefill_tokens", "num_decode_tokens"),
    )
    rows = rng.integers(0, len(data), size=n)
    systems = [rng.integers(0, 32_000, 512).tolist() for _ in range(16)]
    out = []
    for i, row in enumerate(rows):
        prompt_len = int(min(data["num_prefill_tokens"][row], MAX_MODEL_LEN - 1))
        max_tokens = int(max(1, min(data["num_decode_tokens"][row], MAX_MODEL_LEN - prompt_len)))
        prefix = systems[int(rng.integers(0, 16))][:prompt_len] if rng.random() < 0.5 else []
        body = rng.integers(0, 32_000, prompt_len - len(prefix)).tolist()
        out.append(Request(f"r{i}", prefix + body, max_tokens=max_tokens, arrival_time=0.0))
    return out


class NoOpManager:
    """The manager's calling shape with nothing behind it: every allocation succeeds."""

    def __init__(self) -> None:
        self.row = list(range(1, 65))  # a 64-block table row for every request

    def get_computed_blocks(self, request):
        return (), 0

    def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
        return ()

    def get_block_ids(self, request_id):
        return self.row

    def free(self, request):
        pass

    def take_blocks_to_copy(self):
        return []


def run(requests: list[Request], num_gpu_blocks: int | None) -> dict:
    cfg = EngineConfig(
        max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=8192, max_model_len=MAX_MODEL_LEN
    )
    kv = (
        NoOpManager()
        if num_gpu_blocks is None
        else KVCacheManager(num_gpu_blocks=num_gpu_blocks, block_size=16, enable_caching=True)
    )
    sched = Scheduler(cfg, kv)
    for r in requests:
        sched.add_request(r)
    steps = request_steps = 0
    t_sched = t_update = 0.0
    clock = time.perf_counter
    cpu0 = time.process_time()
    while sched.has_unfinished_requests():
        t0 = clock()
        out = sched.schedule()
        t1 = clock()
        sampled = {}
        for sr in out.scheduled:
            r = sr.request
            if sr.num_computed_tokens + sr.num_new_tokens >= r.num_tokens:
                sampled[r.request_id] = synthetic_token(r, len(r.output_token_ids))
        t2 = clock()
        sched.update_from_output(out, ModelRunnerOutput(0.0, sampled))
        t3 = clock()
        t_sched += t1 - t0
        t_update += t3 - t2
        steps += 1
        request_steps += len(out.scheduled)
    cpu = time.process_time() - cpu0  # includes the few sampling lines between the calls
    assert sched.stats.num_finished == len(requests)
    return dict(
        steps=steps,
        request_steps=request_steps,
        mean_running=request_steps / steps,
        schedule_s=t_sched,
        update_s=t_update,
        wall_us_per_req_step=1e6 * (t_sched + t_update) / request_steps,
        cpu_us_per_req_step=1e6 * cpu / request_steps,
        preemptions=sched.stats.num_preemptions,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for case, blocks in CASES.items():
        res = run(make_requests(args.num_requests, args.seed), blocks)
        rows.append(dict(case=case, num_gpu_blocks=blocks, **res))
    cols = [
        "case",
        "num_gpu_blocks",
        "steps",
        "request_steps",
        "mean_running",
        "schedule_s",
        "update_s",
        "wall_us_per_req_step",
        "cpu_us_per_req_step",
        "preemptions",
    ]
    print(
        f"{args.num_requests} requests, seed {args.seed}, python {platform.python_version()}, "
        f"{datetime.date.today()}"
    )
    print("  ".join(f"{c:>20}" for c in cols))
    for row in rows:
        print(
            "  ".join(
                f"{row[c]:>20.3f}" if isinstance(row[c], float) else f"{row[c]!s:>20}" for c in cols
            )
        )
    out = ROOT / "results" / "scheduler_step.csv"
    out.parent.mkdir(exist_ok=True)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
