"""Compare two decision logs and report the first divergence, with context.

Fields are compared in the order an engine decides them within a step: the step clock and
arrivals, the scheduled requests with their token counts (admission order, chunk sizes),
prefix hits, preemption victims, block ids, finished requests, evicted blocks, and the
free-block queue after the step. Everything must match exactly, except that with
`block_ids="renamed"` block ids may differ by one consistent renaming for the whole run:
decisions depend on a block's position in the free queue and on its hash, never on the number
printed on it, so a renaming (another null-block id, another numbering of the pool) cannot
change any later decision. Any inconsistent use of a renaming is a divergence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pagesim.parity.decisions import DecisionLog, StepDecisions, decode_free_queues

BLOCK_ID_MODES = ("exact", "renamed")
CONTEXT_STEPS = 3  # agreeing steps shown before the divergence
QUEUE_SHOWN = 24  # free-queue entries shown (head first)


@dataclass(frozen=True)
class Divergence:
    """The first place where two logs disagree."""

    step_index: int  # position in the step list
    t: int  # engine step of the expected log
    what: str  # which decision: "scheduled", "hits", "preempted", "blocks", ...
    request_id: str | None
    expected: Any
    actual: Any
    context: str  # human-readable: the step on both sides, earlier steps, requests, queue


@dataclass(frozen=True)
class ParityReport:
    """Result of comparing a candidate log against a reference (golden) log."""

    reference: dict[str, Any]  # recorded_with of the reference
    candidate: dict[str, Any]
    workload: str
    vllm_compat: str
    steps_compared: int
    block_ids: str
    divergence: Divergence | None = None
    summary: dict[str, int] = field(default_factory=dict)  # of the reference

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def format(self) -> str:
        ref, cand = _label(self.reference), _label(self.candidate)
        head = (
            f"{self.workload}: {cand} vs {ref} (vllm_compat {self.vllm_compat}, "
            f"block ids {self.block_ids})"
        )
        if self.divergence is None:
            s = self.summary
            return (
                f"{head}\n  MATCH: {self.steps_compared} steps, {s.get('scheduled_tokens', 0)}"
                f" scheduled tokens, {s.get('hit_tokens', 0)} hit tokens, "
                f"{s.get('preemptions', 0)} preemptions, {s.get('evictions', 0)} evictions"
            )
        d = self.divergence
        who = f" of {d.request_id}" if d.request_id else ""
        return (
            f"{head}\n  DIVERGED at step t={d.t} (record #{d.step_index}): {d.what}{who}\n"
            f"    {ref:<14}: {_short(d.expected)}\n    {cand:<14}: {_short(d.actual)}\n"
            f"{d.context}"
        )


class _BlockMap:
    """Exact equality, or one consistent renaming of reference ids to candidate ids."""

    def __init__(self, mode: str) -> None:
        if mode not in BLOCK_ID_MODES:
            raise ValueError(f"block_ids={mode!r}: choose one of {', '.join(BLOCK_ID_MODES)}")
        self.renamed = mode == "renamed"
        self.fwd: dict[int, int] = {}
        self.back: dict[int, int] = {}

    def same(self, ref: Sequence[int], cand: Sequence[int]) -> bool:
        if len(ref) != len(cand):
            return False
        if not self.renamed:
            return list(ref) == list(cand)
        for a, b in zip(ref, cand, strict=True):
            if self.fwd.get(a, b) != b or self.back.get(b, a) != a:
                return False
            self.fwd[a], self.back[b] = b, a
        return True

    def same_set(self, ref: Sequence[int], cand: Sequence[int]) -> bool:
        """Equal as sets of blocks; under renaming, ids bound so far must correspond."""
        if not self.renamed:
            return sorted(ref) == sorted(cand)
        rs, cs = set(ref), set(cand)
        return (
            len(rs) == len(cs)
            and all(self.fwd[a] in cs for a in rs if a in self.fwd)
            and all(self.back[b] in rs for b in cs if b in self.back)
        )


@dataclass
class _Side:
    """Per-request history of one log, for the context of a report."""

    tables: dict[str, list[int]] = field(default_factory=dict)
    events: dict[str, list[str]] = field(default_factory=dict)
    queue: list[int] = field(default_factory=list)

    def apply(self, step: StepDecisions, queue: list[int]) -> None:
        for rid in step.added:
            self.events.setdefault(rid, []).append(f"added t={step.t}")
        for rid, n in step.hits:
            self.events.setdefault(rid, []).append(f"admitted t={step.t} hit={n}")
        for rid in step.preempted:
            self.events.setdefault(rid, []).append(f"preempted t={step.t}")
            self.tables.pop(rid, None)
        for rid, blocks in step.new_blocks:
            self.tables[rid] = self.tables.get(rid, []) + list(blocks)
        for rid in step.finished:
            self.events.setdefault(rid, []).append(f"finished t={step.t}")
            self.tables.pop(rid, None)
        self.queue = queue


def compare_logs(
    reference: DecisionLog, candidate: DecisionLog, block_ids: str = "exact"
) -> ParityReport:
    """Walk both logs step by step; stop at the first difference."""
    bmap = _BlockMap(block_ids)
    ref_side = _Side(queue=list(reference.initial_free_queue))
    cand_side = _Side(queue=list(candidate.initial_free_queue))
    report = dict(
        reference=reference.recorded_with,
        candidate=candidate.recorded_with,
        workload=reference.workload.get("name", "?"),
        vllm_compat=reference.vllm_compat,
        block_ids=block_ids,
        summary=reference.summary(),
    )
    if not bmap.same(ref_side.queue, cand_side.queue):
        shown = ref_side.queue[:QUEUE_SHOWN], cand_side.queue[:QUEUE_SHOWN]
        div = Divergence(0, 0, "initial free queue", None, *shown, "")
        return ParityReport(steps_compared=0, divergence=div, **report)
    ref_q, cand_q = decode_free_queues(reference), decode_free_queues(candidate)
    for i in range(max(len(reference.steps), len(candidate.steps))):
        if i >= len(reference.steps) or i >= len(candidate.steps):
            missing = "reference" if i >= len(reference.steps) else "candidate"
            extra = candidate.steps[i] if missing == "reference" else reference.steps[i]
            div = _divergence(
                i,
                extra,
                "number of steps",
                None,
                len(reference.steps),
                len(candidate.steps),
                reference,
                candidate,
                ref_side,
                cand_side,
            )
            return ParityReport(steps_compared=i, divergence=div, **report)
        rs, cs = reference.steps[i], candidate.steps[i]
        rq, cq = next(ref_q), next(cand_q)
        found = _first_difference(rs, cs, rq, cq, bmap)
        if found is not None:
            what, rid, exp, act = found
            div = _divergence(
                i, rs, what, rid, exp, act, reference, candidate, ref_side, cand_side, cs, (rq, cq)
            )
            return ParityReport(steps_compared=i, divergence=div, **report)
        ref_side.apply(rs, rq)
        cand_side.apply(cs, cq)
    return ParityReport(steps_compared=len(reference.steps), **report)


def _first_difference(
    rs: StepDecisions, cs: StepDecisions, rq: list[int], cq: list[int], bmap: _BlockMap
) -> tuple[str, str | None, Any, Any] | None:
    if rs.t != cs.t:
        return "step clock", None, rs.t, cs.t
    if rs.added != cs.added:
        return "arrivals", None, rs.added, cs.added
    for what, a, b in (("scheduled", rs.scheduled, cs.scheduled), ("hits", rs.hits, cs.hits)):
        for k in range(max(len(a), len(b))):
            x, y = (a[k] if k < len(a) else None), (b[k] if k < len(b) else None)
            if x != y:
                rid = (x or y)[0]  # type: ignore[index]
                return what, rid, x, y
    if rs.preempted != cs.preempted:
        return "preemption victims", None, rs.preempted, cs.preempted
    if [r for r, _ in rs.new_blocks] != [r for r, _ in cs.new_blocks]:
        return (
            "requests given blocks",
            None,
            [r for r, _ in rs.new_blocks],
            [r for r, _ in cs.new_blocks],
        )
    for (rid, ids_a), (_, ids_b) in zip(rs.new_blocks, cs.new_blocks, strict=True):
        if not bmap.same(ids_a, ids_b):
            return "block ids", rid, ids_a, ids_b
    if rs.finished != cs.finished:
        return "finished", None, rs.finished, cs.finished
    if not bmap.same_set(rs.evicted, cs.evicted):
        return "evicted blocks", None, rs.evicted, cs.evicted
    if not bmap.same(rq, cq):
        return "free-queue order after the step", None, rq, cq
    return None


def _divergence(
    i: int,
    step: StepDecisions,
    what: str,
    rid: str | None,
    exp: Any,
    act: Any,
    reference: DecisionLog,
    candidate: DecisionLog,
    ref_side: _Side,
    cand_side: _Side,
    cand_step: StepDecisions | None = None,
    queues: tuple[list[int], list[int]] | None = None,
) -> Divergence:
    ref, cand = _label(reference.recorded_with), _label(candidate.recorded_with)
    lines = [f"  step t={step.t}:", f"    {ref:<14}: {_step_line(step)}"]
    if cand_step is not None:
        lines.append(f"    {cand:<14}: {_step_line(cand_step)}")
    lines.append(f"  previous {CONTEXT_STEPS} steps (identical in both):")
    lines += [f"    {_step_line(s)}" for s in reference.steps[max(0, i - CONTEXT_STEPS) : i]]
    rids = [rid] if rid else (step.preempted + step.finished or [r for r, _ in step.scheduled])[:4]
    for r in rids:
        lines.append(f"  request {r}: {', '.join(ref_side.events.get(r, ['not seen']))}")
        lines.append(
            f"    table before the step: {ref}={_short(ref_side.tables.get(r))}"
            f" {cand}={_short(cand_side.tables.get(r))}"
        )
    lines.append(f"  free queue before the step (head first): {_short(ref_side.queue)}")
    if queues is not None and what.startswith("free-queue"):
        k = next(
            (j for j, (a, b) in enumerate(zip(*queues, strict=False)) if a != b),
            min(map(len, queues)),
        )
        lo = max(0, k - 4)
        lines.append(
            f"  free queues first differ at position {k} (of {len(queues[0])} / "
            f"{len(queues[1])}); entries {lo}..{lo + QUEUE_SHOWN - 1}:"
        )
        lines.append(f"    {ref:<14}: {queues[0][lo : lo + QUEUE_SHOWN]}")
        lines.append(f"    {cand:<14}: {queues[1][lo : lo + QUEUE_SHOWN]}")
    return Divergence(i, step.t, what, rid, exp, act, "\n".join(lines))


def _step_line(s: StepDecisions) -> str:
    parts = ["s=[" + " ".join(f"{r}:{n}" for r, n in s.scheduled) + "]"]
    for name, items in (
        ("hit", [f"{r}:{n}" for r, n in s.hits]),
        ("pre", s.preempted),
        ("fin", s.finished),
    ):
        if items:
            parts.append(f"{name}=[{' '.join(items)}]")
    if s.evicted:
        parts.append(f"ev={len(s.evicted)}")
    return f"t={s.t} " + " ".join(parts)


def _short(x: Any, n: int = QUEUE_SHOWN) -> str:
    if isinstance(x, list) and len(x) > n:
        return f"{x[:n]} ... ({len(x)} in all)"
    return str(x)


def _label(recorded_with: dict[str, Any]) -> str:
    return f"{recorded_with.get('engine', '?')} {recorded_with.get('version', '')}".strip()
