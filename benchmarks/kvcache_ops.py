"""Throughput of the KV cache's hot operations on a ShareGPT-shaped request stream.

Request lengths are drawn (seeded) from the ShareGPT token-count trace of sarathi-serve
(prompt and output tokens per request); half of the prompts start with one of 16 shared 512-token
system prompts, the rest of every prompt is unique. Everything runs in this one process, on one
core. Each operation is timed `--repeats` times on fresh state after a warm-up; the table shows
the median and the spread (min..max) per wall-clock second, and the median per CPU second (the
cost on one core when the machine is shared and the process waits for a core).

Operations (units in brackets):
  pool_alloc_free       BlockPool.get_new_blocks + free_blocks, 64 live requests     [blocks]
  mgr_admit_free_nocache  KVCacheManager admit (allocate_slots for the prompt) + free,
                        prefix caching off                                          [blocks]
  mgr_admit_free        the same with prefix caching on (includes hashing prompts)  [blocks]
  mgr_decode_step       allocate_slots(req, 1) per generated token, 64 live         [calls]
  prefix_lookup         get_computed_blocks on prompts whose hashes are known       [lookups]
  hash_and_lookup       get_computed_blocks on fresh requests (hashes computed)     [blocks]

Usage: python benchmarks/kvcache_ops.py [--num-requests 2000] [--repeats 5]
Writes results/kvcache_ops.csv.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pagesim.kvcache import BlockPool, KVCacheManager  # noqa: E402
from pagesim.request import Request  # noqa: E402

TRACE = (
    ROOT.parent
    / "shared"
    / "traces"
    / "microsoft-sarathi-serve"
    / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
)
BLOCK_SIZE = 16
LIVE = 64  # concurrently held requests
NUM_GPU_BLOCKS = 60_000  # ~960k tokens: large enough that 64 ShareGPT requests never fail
SYSTEM_PROMPT_TOKENS = 512
NUM_SYSTEM_PROMPTS = 16
MAX_DECODE_TOKENS = 64  # decode steps per request in mgr_decode_step (keeps the run short)


def load_lengths(path: Path) -> tuple[np.ndarray, np.ndarray]:
    data = np.genfromtxt(
        path,
        delimiter=",",
        names=True,
        dtype=np.int64,
        usecols=("num_prefill_tokens", "num_decode_tokens"),
    )
    return data["num_prefill_tokens"], data["num_decode_tokens"]


def make_stream(n: int, seed: int, trace: Path) -> list[tuple[list[int], int]]:
    """(prompt token ids, output length) per request, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    prompts_len, outputs_len = load_lengths(trace)
    rows = rng.integers(0, len(prompts_len), size=n)
    systems = [
        rng.integers(0, 32_000, SYSTEM_PROMPT_TOKENS).tolist() for _ in range(NUM_SYSTEM_PROMPTS)
    ]
    stream = []
    for row in rows:
        length = int(prompts_len[row])
        prefix: list[int] = []
        if rng.random() < 0.5:
            prefix = systems[int(rng.integers(0, NUM_SYSTEM_PROMPTS))][:length]
        body = rng.integers(0, 32_000, length - len(prefix)).tolist()
        stream.append((prefix + body, int(outputs_len[row])))
    return stream


def requests_of(stream: list[tuple[list[int], int]], tag: str) -> list[Request]:
    return [Request(f"{tag}{i}", prompt, max_tokens=out) for i, (prompt, out) in enumerate(stream)]


# ---- operations: each builds fresh state, runs, returns (work count, Timer) ------------------
class Timer:
    """Wall and CPU seconds of the timed sections. On a shared machine the CPU time is the
    cost on one core; wall time also counts the time the process waited for a core."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self._t0 = (0.0, 0.0)

    def start(self) -> None:
        self._t0 = (time.perf_counter(), time.process_time())

    def stop(self) -> Timer:
        self.wall += time.perf_counter() - self._t0[0]
        self.cpu += time.process_time() - self._t0[1]
        return self


def op_pool_alloc_free(stream) -> tuple[int, Timer]:
    pool = BlockPool(NUM_GPU_BLOCKS, enable_caching=True)
    sizes = [-(-len(p) // BLOCK_SIZE) for p, _ in stream]
    live: list[list] = []
    count = 0
    timer = Timer()
    timer.start()
    for n in sizes:
        live.append(pool.get_new_blocks(n))
        if len(live) > LIVE:
            blocks = live.pop(0)
            pool.free_blocks(reversed(blocks))
            count += 2 * len(blocks)
    return count, timer.stop()


def _admit_free(stream, enable_caching: bool) -> tuple[int, Timer]:
    mgr = KVCacheManager(NUM_GPU_BLOCKS, BLOCK_SIZE, enable_caching=enable_caching)
    reqs = requests_of(stream, "a")
    live: list[Request] = []
    count = 0
    timer = Timer()
    timer.start()
    for req in reqs:
        hit, num_hit = mgr.get_computed_blocks(req)
        new = mgr.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
        req.num_computed_tokens = req.num_tokens
        count += len(new)  # allocations; releases are counted at free
        live.append(req)
        if len(live) > LIVE:
            old = live.pop(0)
            count += len(mgr.get_block_ids(old.request_id))
            mgr.free(old)
    return count, timer.stop()


def op_mgr_admit_free_nocache(stream) -> tuple[int, Timer]:
    return _admit_free(stream, enable_caching=False)


def op_mgr_admit_free(stream) -> tuple[int, Timer]:
    return _admit_free(stream, enable_caching=True)


def op_mgr_decode_step(stream) -> tuple[int, Timer]:
    """The simulator's per-step loop: every live request gains one token per step."""
    mgr = KVCacheManager(NUM_GPU_BLOCKS, BLOCK_SIZE, enable_caching=True)
    reqs = requests_of(stream, "d")
    for req in reqs:  # admission is timed elsewhere
        mgr.hasher.extend(req)
    pending = list(reversed(reqs))
    live: list[Request] = []
    calls = 0
    timer = Timer()
    while pending or live:
        while pending and len(live) < LIVE:
            req = pending.pop()
            hit, num_hit = mgr.get_computed_blocks(req)
            mgr.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
            req.num_computed_tokens = req.num_tokens
            live.append(req)
        timer.start()
        allocate = mgr.allocate_slots
        for req in live:
            req.output_token_ids.append(7)
            allocate(req, 1)
            req.num_computed_tokens += 1
        calls += len(live)
        timer.stop()
        done = [r for r in live if len(r.output_token_ids) >= min(r.max_tokens, MAX_DECODE_TOKENS)]
        for req in done:
            mgr.free(req)
        live = [r for r in live if r not in done]
    return calls, timer


def _populated_manager(stream) -> KVCacheManager:
    mgr = KVCacheManager(NUM_GPU_BLOCKS * 4, BLOCK_SIZE, enable_caching=True)
    for req in requests_of(stream, "p"):
        hit, num_hit = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, req.num_tokens - num_hit, num_hit, hit)
        req.num_computed_tokens = req.num_tokens
        mgr.free(req)  # stays cached: the pool is 4x the stream
    return mgr


def op_prefix_lookup(stream) -> tuple[int, Timer]:
    mgr = _populated_manager(stream)
    reqs = requests_of(stream, "q")
    for req in reqs:
        mgr.hasher.extend(req)
    timer = Timer()
    timer.start()
    lookups = 0
    for req in reqs:
        hit, _ = mgr.get_computed_blocks(req)
        lookups += len(hit) + (len(hit) < (req.num_tokens - 1) // BLOCK_SIZE)
    return lookups, timer.stop()


def op_hash_and_lookup(stream) -> tuple[int, Timer]:
    mgr = _populated_manager(stream)
    reqs = requests_of(stream, "h")
    timer = Timer()
    timer.start()
    for req in reqs:
        mgr.get_computed_blocks(req)
    timer.stop()
    return sum(len(r.block_hashes) for r in reqs), timer


OPS: dict[str, tuple[str, Callable]] = {
    "pool_alloc_free": ("blocks", op_pool_alloc_free),
    "mgr_admit_free_nocache": ("blocks", op_mgr_admit_free_nocache),
    "mgr_admit_free": ("blocks", op_mgr_admit_free),
    "mgr_decode_step": ("calls", op_mgr_decode_step),
    "prefix_lookup": ("lookups", op_prefix_lookup),
    "hash_and_lookup": ("blocks", op_hash_and_lookup),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(OPS))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "kvcache_ops.csv")
    args = parser.parse_args(argv)
    stream = make_stream(args.num_requests, args.seed, args.trace)
    rows = []
    print(
        f"{'operation':<24}{'unit':>9}{'median/s':>14}{'min/s':>14}{'max/s':>14}"
        f"{'median/cpu-s':>14}{'count':>11}"
    )
    for name in args.only or list(OPS):
        unit, op = OPS[name]
        op(stream[: max(1, len(stream) // 10)])  # warm-up
        runs = [op(stream) for _ in range(args.repeats)]
        rates = [count / timer.wall for count, timer in runs]
        cpu_rates = [count / timer.cpu for count, timer in runs]
        med, cpu_med = statistics.median(rates), statistics.median(cpu_rates)
        rows.append(
            {
                "operation": name,
                "unit": unit,
                "median_per_s": round(med),
                "min_per_s": round(min(rates)),
                "max_per_s": round(max(rates)),
                "median_per_cpu_s": round(cpu_med),
                "count_per_repeat": runs[0][0],
                "repeats": args.repeats,
            }
        )
        print(
            f"{name:<24}{unit:>9}{med:>14,.0f}{min(rates):>14,.0f}{max(rates):>14,.0f}"
            f"{cpu_med:>14,.0f}{runs[0][0]:>11,}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(
            f, fieldnames=[*rows[0], "python", "machine", "date", "num_requests", "seed"]
        )
        writer.writeheader()
        meta = {
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "date": datetime.date.today().isoformat(),
            "num_requests": args.num_requests,
            "seed": args.seed,
        }
        for row in rows:
            writer.writerow({**row, **meta})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
