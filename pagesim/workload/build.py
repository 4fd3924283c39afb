"""`Workload`: a parsed spec that samples deterministic `RequestPlan`s.

Random streams: every draw comes from a `numpy.random.Generator` made from the seed and a
fixed stream number, so adding a draw to one stream never shifts another. Lengths use
`default_rng(seed)` itself for a top-level workload, as vLLM's random dataset does; a mix's
component c uses the entropy (seed, c + 1) in place of (seed,).

More requests than a trace has rows:
- replayed traces (`trace:`) wrap around: lap L replays the rows with timestamps shifted by
  L * (duration + mean gap), so the mean rate is kept, and with fresh content (Mooncake
  hash ids renumbered per lap), so a lap never hits the previous lap's cache;
- sampled lengths (`lengths: trace:`) follow `vllm bench serve`: shuffle, then draw the extra
  rows with replacement (see `TraceLengths`); each request still gets its own content.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

from pagesim.errors import WorkloadError
from pagesim.workload.lengths import Dist, RandomLengths
from pagesim.workload.plan import RequestColumns, RequestPlan
from pagesim.workload.sessions import assign_sessions
from pagesim.workload.spec import PrefixSpec, TenantSpec, WorkloadSpec
from pagesim.workload.tokens import MOONCAKE_BLOCK_TOKENS, content_key, max_roots, token_table
from pagesim.workload.traces import TraceData

# Stream numbers appended to the seed entropy (never reuse or renumber: plans would change).
_PREFIX, _SESSIONS, _THINK, _TENANTS, _MIX = 1, 2, 3, 4, 5


class Workload:
    """A workload ready to sample: `load_workload(...)` returns one."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"Workload({self.name!r})"

    def sample(self, num_prompts: int, seed: int = 0, vocab_size: int = 32000) -> RequestPlan:
        """The request plan of `num_prompts` requests (turns, for multi-turn workloads).

        Deterministic: the same workload, num_prompts, seed and vocab_size give the same plan
        byte for byte in any process. Raises `WorkloadError` on bad arguments.
        """
        for name, v, lo in (
            ("num_prompts", num_prompts, 1),
            ("seed", seed, 0),
            ("vocab_size", vocab_size, 2),
        ):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < lo:
                raise WorkloadError(f"{name} = {v!r}: must be an integer >= {lo}")
        cols = _build(self.spec, int(num_prompts), (int(seed),))
        if cols.num_roots > max_roots(vocab_size):
            raise WorkloadError(
                f"vocab_size = {vocab_size}: too small for {cols.num_roots} "
                f"distinct prompt roots (needs vocab_size**2 >= roots)"
            )
        if self.spec.arrival.process != "trace":
            cols = replace(cols, trace_times_s=None)
        offsets = cols.session_offsets
        return RequestPlan(
            **{f.name: getattr(cols, f.name) for f in fields(RequestColumns)},
            name=self.name,
            seed=int(seed),
            vocab_size=int(vocab_size),
            content_key=content_key(int(seed)),
            token_table=token_table(int(seed), int(vocab_size)),
            sessions=np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets)),
            arrival=self.spec.arrival,
            n=self.spec.n,
        )


def _rng(entropy: tuple[int, ...], stream: int) -> np.random.Generator:
    return np.random.default_rng([*entropy, stream])


def _build(spec: WorkloadSpec, n: int, entropy: tuple[int, ...]) -> RequestColumns:
    if spec.mix:
        cols = _build_mix(spec, n, entropy)
    elif spec.trace is not None:
        cols = _build_trace(spec.trace, n)
    else:
        cols = _build_lengths(spec, n, entropy)
    if spec.tenants is not None:
        cols = _assign_tenants(cols, spec.tenants, spec.name, entropy)
    return cols


def _single_turns(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(turns, think_time_s, session_offsets) of n one-turn sessions."""
    return (
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.float64),
        np.arange(n + 1, dtype=np.int64),
    )


def _build_trace(trace: TraceData, n: int) -> RequestColumns:
    rows = trace.num_rows
    idx = np.arange(n, dtype=np.int64) % rows
    lap = np.arange(n, dtype=np.int64) // rows
    prompt = trace.prompt_lens[idx]
    times = None
    if trace.timestamps_s is not None:
        last = float(trace.timestamps_s[-1])
        period = last + (last / (rows - 1) if rows > 1 else 0.0)
        times = trace.timestamps_s[idx] + lap * period
    if trace.block_offsets is not None and trace.block_ids is not None:
        # Gather each request's ids from the trace's CSR: offsets of the new CSR, then
        # flat positions = row start + position within the row.
        counts = np.diff(trace.block_offsets)[idx]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        flat = np.repeat(trace.block_offsets[idx] - offsets[:-1], counts) + np.arange(
            offsets[-1], dtype=np.int64
        )
        ids_per_lap = int(trace.block_ids.max()) + 1 if len(trace.block_ids) else 0
        block_roots = trace.block_ids[flat] + np.repeat(lap, counts) * ids_per_lap
        covered = np.minimum(prompt, counts * MOONCAKE_BLOCK_TOKENS)
        n_block_roots = ids_per_lap * (int(lap[-1]) + 1)
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        block_roots = np.zeros(0, dtype=np.int64)
        covered = np.zeros(n, dtype=np.int64)
        n_block_roots = 0
    turns, think, sessions = _single_turns(n)
    zeros = np.zeros(n, dtype=np.int64)
    return RequestColumns(
        prompt,
        trace.output_lens[idx],
        zeros,
        zeros.copy(),
        prompt - covered,
        n_block_roots + np.arange(n, dtype=np.int64),
        offsets,
        block_roots,
        zeros.copy(),
        (None,),
        turns,
        think,
        sessions,
        times,
        n_block_roots + n,
    )


def _build_lengths(spec: WorkloadSpec, n: int, entropy: tuple[int, ...]) -> RequestColumns:
    model = spec.lengths
    assert model is not None
    user, output = model.draw(np.random.default_rng(list(entropy)), n)
    prefix = spec.prefix
    if isinstance(model, RandomLengths) and model.prefix_len > 0:
        prefix = PrefixSpec(groups=1, length=_fixed(model.prefix_len))
    # Per potential session (at most n): prefix group, prefix length, target turns.
    if prefix is not None:
        rng = _rng(entropy, _PREFIX)
        group_lens = prefix.length.sample(rng, prefix.groups, integer=True, floor=1)
        group = rng.choice(prefix.groups, size=n, p=_zipf(prefix.groups, prefix.zipf))
        sess_prefix = group_lens[group]
        n_groups = prefix.groups
    else:
        group = np.zeros(n, dtype=np.int64)
        sess_prefix = np.zeros(n, dtype=np.int64)
        n_groups = 0
    if spec.sessions is not None:
        ss = spec.sessions
        target = ss.turns.sample(_rng(entropy, _SESSIONS), n, integer=True, floor=1)
        offsets, prompt = assign_sessions(user, output, sess_prefix, target, ss.max_context_tokens)
        counts = np.diff(offsets)
        turns = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], counts)
        think = ss.think_time_s.sample(_rng(entropy, _THINK), n, integer=False, floor=0.0)
        think[turns == 0] = 0.0
    else:
        turns, think, offsets = _single_turns(n)
        counts = np.ones(n, dtype=np.int64)
        prompt = sess_prefix + user
    num_sessions = len(offsets) - 1
    prefix_lens = np.repeat(sess_prefix[:num_sessions], counts)
    prefix_roots = np.repeat(group[:num_sessions], counts).astype(np.int64)
    return RequestColumns(
        prompt,
        output,
        prefix_lens,
        prefix_roots,
        user,
        n_groups + np.arange(n, dtype=np.int64),
        np.zeros(n + 1, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        (None,),
        turns,
        think,
        offsets,
        None,
        n_groups + n,
    )


def _fixed(value: int) -> Dist:
    return Dist("fixed", value=float(value))


def _zipf(k: int, s: float) -> np.ndarray:
    """Probabilities of ranks 0..k-1 proportional to 1/(rank+1)^s (s = 0: uniform)."""
    w = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** s
    return w / w.sum()


def _assign_tenants(
    cols: RequestColumns, t: TenantSpec, name: str, entropy: tuple[int, ...]
) -> RequestColumns:
    num_sessions = len(cols.session_offsets) - 1
    per_session = _rng(entropy, _TENANTS).choice(
        t.count, size=num_sessions, p=_zipf(t.count, t.zipf)
    )
    tenants = np.repeat(per_session.astype(np.int64), np.diff(cols.session_offsets))
    salts = tuple(f"{name}/tenant-{k}" for k in range(t.count))
    return replace(cols, tenants=tenants, tenant_salts=salts)


def _split(weights: list[float], n: int) -> list[int]:
    """Largest-remainder apportionment of n requests by weight (ties: earlier component)."""
    w = np.asarray(weights, dtype=np.float64)
    exact = w / w.sum() * n
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[: n - int(counts.sum())]] += 1
    return counts.tolist()


def _build_mix(spec: WorkloadSpec, n: int, entropy: tuple[int, ...]) -> RequestColumns:
    """Components' requests in proportion to their weights, sessions interleaved at random.

    Each component keeps its own lengths, prefixes, sessions and hash ids (content never
    shared across components); their arrival processes are replaced by the mix's own.
    """
    parts = []
    for c, (comp, count) in enumerate(
        zip(spec.mix, _split([m.weight for m in spec.mix], n), strict=True)
    ):
        if count:
            parts.append(_build(comp.spec, count, (*entropy, c + 1)))
    root_base = np.cumsum([0] + [p.num_roots for p in parts])
    salt_base = np.cumsum([0] + [len(p.tenant_salts) for p in parts])
    req_base = np.cumsum([0] + [len(p.prompt_lens) for p in parts])
    cat = np.concatenate
    sess_off = cat(
        [p.session_offsets[:-1] + b for p, b in zip(parts, req_base, strict=False)] + [[n]]
    ).astype(np.int64)
    block_counts = cat([np.diff(p.block_offsets) for p in parts])
    block_start = cat(
        [
            p.block_offsets[:-1] + b
            for p, b in zip(
                parts, np.cumsum([0] + [len(p.block_roots) for p in parts]), strict=False
            )
        ]
    )
    merged_blocks = cat([p.block_roots + r for p, r in zip(parts, root_base, strict=False)])

    # Interleave whole sessions: a seeded permutation of session order, requests follow.
    num_sessions = len(sess_off) - 1
    perm = _rng(entropy, _MIX).permutation(num_sessions)
    sizes = np.diff(sess_off)[perm]
    new_off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    order = np.repeat(sess_off[:-1][perm] - new_off[:-1], sizes) + np.arange(n, dtype=np.int64)

    def col(name: str, base: np.ndarray | None = None) -> np.ndarray:
        arrays = [getattr(p, name) + (0 if base is None else base[k]) for k, p in enumerate(parts)]
        return cat(arrays)[order]

    counts = block_counts[order]
    b_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    flat = np.repeat(block_start[order] - b_off[:-1], counts) + np.arange(b_off[-1])
    return RequestColumns(
        col("prompt_lens"),
        col("output_lens"),
        col("prefix_lens"),
        col("prefix_roots", root_base),
        col("user_lens"),
        col("user_roots", root_base),
        b_off,
        merged_blocks[flat].astype(np.int64),
        col("tenants", salt_base),
        tuple(s for p in parts for s in p.tenant_salts),
        col("turns"),
        col("think_time_s"),
        new_off,
        None,
        int(root_base[-1]),
    )
