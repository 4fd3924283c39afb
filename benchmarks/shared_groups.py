"""Decode steps whose sequences share prefixes in several groups, against unshared references
(GPU).

The calibration's shared-prefix rows (`decode_shared.csv`) share one prefix among all the
sequences of a step. A served prefix-caching workload has several groups in one step (the
`system-prompt` workload: 16 system prompts of 512-2,048 tokens, Zipf popularity), with
contexts of many lengths. This times, in interleaved rounds in one runner:

    uniform    B sequences of context C in G equal groups, each sharing its first S tokens
    run-like   B sequences drawn as the system-prompt workload draws them: a group by Zipf(1)
               over 16 groups, the group's prefix (uniform 512-2,048 tokens, a block
               multiple), a unique user part (lognormal, mean 256) and decode progress
               (uniform 0-192)

each with its reference: the same contexts over distinct blocks. The ratio of the two is
what the re-read fraction is fitted on, so rows from this call compare with a profile of
another call.

    PYTHONPATH=. python3 benchmarks/shared_groups.py --models llama-2-7b,llama-3-8b --out $OUT

Prints a table; writes shared_groups.csv under --out.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def grouped_step(
    contexts: list[int],
    groups: list[int],
    shared: dict[int, int],
    block_size: int,
    blocks,
    step_id: int = 0,
    news: list[int] | None = None,
):
    """A step: sequence i has context `contexts[i]` and computes `news[i]` new tokens (default
    one: a decode; decodes come first), and its first `shared[g]` tokens (a block multiple)
    are the same blocks for every sequence of its group g = groups[i]. Group -1 shares
    nothing. None if the cache cannot hold the blocks."""
    news = news or [1] * len(contexts)
    from pagesim.gpu.calibrate import _request
    from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput

    names = sorted({g for g in groups if g >= 0})
    common = [shared[g] // block_size for g in names]
    own = [
        -(-(c + n) // block_size) - (shared[g] // block_size if g >= 0 else 0)
        for c, g, n in zip(contexts, groups, news, strict=True)
    ]
    rows = blocks.take(common + own)
    if rows is None:
        return None
    prefix = dict(zip(names, rows[: len(names)], strict=True))
    out = SchedulerOutput(step_id=step_id, block_size=block_size)
    prompts: dict[int, list[int]] = {}
    for k, (c, g, n) in enumerate(zip(contexts, groups, news, strict=True)):
        row = (prefix[g] if g >= 0 else []) + rows[len(names) + k]
        out.scheduled.append(ScheduledRequest(_request(f"g-{k}", c, n, prompts), n, c, row))
        out.total_num_scheduled_tokens += n
    return out


def run_like(batch: int, seed: int, block_size: int) -> tuple[list[int], list[int], dict]:
    """Contexts, groups and prefix lengths of one decode step of the system-prompt workload."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 17)
    groups = rng.choice(16, size=batch, p=weights / weights.sum()).tolist()
    shared = {g: int(rng.integers(512, 2049)) // block_size * block_size for g in range(16)}
    sigma = np.sqrt(np.log(1 + (192 / 256) ** 2))
    user = np.minimum(rng.lognormal(np.log(256) - sigma**2 / 2, sigma, batch), 1024)
    progress = rng.integers(0, 193, batch)
    contexts = [shared[g] + int(u) + int(p) for g, u, p in zip(groups, user, progress, strict=True)]
    return contexts, groups, shared


def unique_tokens(contexts, groups, shared) -> int:
    seen = {g for g in groups if g >= 0}
    return sum(shared[g] for g in seen) + sum(
        c - (shared[g] if g >= 0 else 0) for c, g in zip(contexts, groups, strict=True)
    )


def shapes(block_size: int) -> list[tuple[str, list[int], list[int], dict, list[int]]]:
    """(label, contexts, groups, shared prefix per group, new tokens per sequence)."""
    out = []
    for b, c, s_list in ((64, 2048, (512, 1536)), (32, 1024, (768,))):
        for s in s_list:
            for g in (1, 2, 4, 8, 16):
                if g <= b:
                    out.append(
                        (
                            f"uniform b={b} c={c} s={s} g={g}",
                            [c] * b,
                            [i % g for i in range(b)],
                            {i: s for i in range(g)},
                            [1] * b,
                        )
                    )
    for b in (16, 48, 96):
        for seed in (0, 1):
            ctx, grp, sh = run_like(b, seed, block_size)
            out.append((f"run-like b={b} seed={seed}", ctx, grp, sh, [1] * b))
    # a system-prompt request joining the batch: its prompt's user part over its group's
    # cached system prompt (the most popular group), in one step with the decodes
    for b in (16, 48):
        for seed in (0, 1):
            ctx, grp, sh = run_like(b, seed, block_size)
            for n in (128, 384):
                out.append(
                    (
                        f"mixed run-like b={b} seed={seed} new={n}",
                        ctx + [sh[0]],
                        grp + [0],
                        sh,
                        [1] * b + [n],
                    )
                )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama-2-7b,llama-3-8b")
    ap.add_argument("--out", default="results")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import torch
    from gpu_bench import device_columns, release, served_runner, write_rows

    from pagesim.gpu.calibrate import BlockSource, CalibrationGrid, measure_interleaved
    from pagesim.gpu.device import device_info

    info = device_info(torch.device("cuda"))
    rows = []
    for name in args.models.split(","):
        t0 = time.monotonic()
        _, runner = served_runner(name)
        blocks = runner.num_gpu_blocks
        runner.record_steps = False
        items, meta = [], []
        for k, (label, ctx, grp, sh, news) in enumerate(shapes(16)):
            plain = [-1] * len(ctx)
            a = grouped_step(ctx, grp, sh, 16, BlockSource(blocks, k), news=news)
            b = grouped_step(ctx, plain, {}, 16, BlockSource(blocks, k), news=news)
            if a is None or b is None:
                continue
            items += [(a, False), (b, False)]
            meta.append((label, ctx, grp, sh, news))
        timings = measure_interleaved(
            runner, items, CalibrationGrid(repeats=args.rounds, min_repeats=args.rounds)
        )
        for k, (label, ctx, grp, sh, news) in enumerate(meta):
            t, ref = timings[2 * k].median * 1e3, timings[2 * k + 1].median * 1e3
            row = {
                "model": name,
                "label": label,
                "batch": len(ctx),
                "context_sum": sum(ctx),
                "unique_tokens": unique_tokens(ctx, grp, sh),
                "groups": len(set(grp)),
                "contexts": " ".join(map(str, ctx)),
                "new_tokens": " ".join(map(str, news)),
                "step_time_ms": t,
                "reference_step_time_ms": ref,
                "ratio": t / ref,
                **device_columns(info),
            }
            rows.append(row)
            print(
                f"{name} {label}: shared {t:.2f} ms, reference {ref:.2f} ms, ratio "
                f"{t / ref:.3f}, unique {row['unique_tokens'] / row['context_sum']:.2f}",
                flush=True,
            )
        print(f"{name}: {time.monotonic() - t0:.0f} s", flush=True)
        release(runner)
    write_rows(args.out, "shared_groups.csv", rows)


if __name__ == "__main__":
    main()
