"""The decision log: what a scheduler + KV cache manager decided, step by step.

One `StepDecisions` per engine step, written as one compact JSON object per line:

    {"t": 12,                         engine step (idle stretches are skipped, see replay.py)
     "add": ["r7"],                   requests added before this step's schedule()
     "s": [["r1", 1], ["r7", 300]],   scheduled request ids in order, with num_scheduled_tokens
     "hit": [["r7", 64]],             prefix-hit tokens of each request admitted (or resumed)
     "pre": ["r3"],                   requests preempted in this step, in preemption order
     "blk": [["r7", "5-6"]],          block ids appended to a request's table this step; for a
                                      request admitted this step, its whole table (hits + new);
                                      with several KV cache groups (a hybrid layout), one
                                      entry per group, named "<rid>:<group>"
     "fin": ["r1"],                   requests that finished at the end of this step
     "ev": "12,9",                    block ids whose cached hash was evicted this step, in
                                      eviction order; "@1-2" when they are, in order, entries
                                      1..2 of this step's "blk" ids (the usual case: eviction
                                      happens when allocation pops a cached block)
     "fq": [head, pop, drop, tail]}   the free-block queue after the step, as an edit of the
                                      previous step's queue (omitted when unchanged)

Lists of block ids are written as runs: "1-4,9,7-5" is [1, 2, 3, 4, 9, 7, 6, 5]
(`ids_to_text`); allocation hands out runs of the free queue, so this is compact.

The free queue after a step is always `head + [b for b in prev[pop:] if b not in drop] + tail`
(freed blocks enter at the head or the tail; allocation and prefix hits only remove), so the
edit is exact and small. `decode_free_queues` rebuilds the full order for every step.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesim.errors import InternalError, PagesimError

FORMAT = "pagesim-parity/1"


class ParityFileError(PagesimError, ValueError):
    """A golden or recorded decision file that cannot be read as one."""


@dataclass(slots=True)
class StepDecisions:
    """Decisions of one engine step (see the module docstring for the JSON keys)."""

    t: int
    added: list[str] = field(default_factory=list)
    scheduled: list[tuple[str, int]] = field(default_factory=list)
    hits: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    new_blocks: list[tuple[str, list[int]]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    free_queue_edit: tuple[list[int], int, list[int], list[int]] | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"t": self.t}
        if self.added:
            d["add"] = self.added
        d["s"] = [list(x) for x in self.scheduled]
        for key, value in (
            ("hit", [list(x) for x in self.hits]),
            ("pre", self.preempted),
            ("blk", [[r, ids_to_text(b)] for r, b in self.new_blocks]),
            ("fin", self.finished),
            ("ev", self._evicted_text()),
        ):
            if value:
                d[key] = value
        if self.free_queue_edit is not None:
            head, pop, drop, tail = self.free_queue_edit
            d["fq"] = [ids_to_text(head), pop, ids_to_text(drop), ids_to_text(tail)]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepDecisions:
        fq = d.get("fq")
        edit = (
            None
            if fq is None
            else (text_to_ids(fq[0]), fq[1], text_to_ids(fq[2]), text_to_ids(fq[3]))
        )
        rec = cls(
            t=d["t"],
            added=list(d.get("add", [])),
            scheduled=[(r, n) for r, n in d.get("s", [])],
            hits=[(r, n) for r, n in d.get("hit", [])],
            preempted=list(d.get("pre", [])),
            new_blocks=[(r, text_to_ids(b)) for r, b in d.get("blk", [])],
            finished=list(d.get("fin", [])),
            free_queue_edit=edit,
        )
        ev = d.get("ev", "")
        if ev.startswith("@"):
            given = [b for _, blocks in rec.new_blocks for b in blocks]
            rec.evicted = [given[i] for i in text_to_ids(ev[1:])]
        else:
            rec.evicted = text_to_ids(ev)
        return rec

    def _evicted_text(self) -> str:
        """Evicted ids as positions in this step's "blk" ids when they are an in-order
        subsequence of them (compact), else as ids."""
        given = [b for _, blocks in self.new_blocks for b in blocks]
        positions: list[int] = []
        k = 0
        for b in self.evicted:
            while k < len(given) and given[k] != b:
                k += 1
            if k == len(given):
                return ids_to_text(self.evicted)
            positions.append(k)
            k += 1
        return "@" + ids_to_text(positions) if positions else ""


@dataclass
class DecisionLog:
    """A whole replay: who recorded it, the workload (segment form), and the steps."""

    recorded_with: dict[str, Any]  # {"engine": "vllm"|"pagesim", "version": ..., ...}
    vllm_compat: str  # the vLLM behaviour followed: "0.33" or "0.23"
    workload: dict[str, Any]  # ParityWorkload.to_json()
    initial_free_queue: list[int]
    steps: list[StepDecisions]

    def summary(self) -> dict[str, int]:
        return {
            "steps": len(self.steps),
            "scheduled_tokens": sum(n for s in self.steps for _, n in s.scheduled),
            "hit_tokens": sum(n for s in self.steps for _, n in s.hits),
            "preemptions": sum(len(s.preempted) for s in self.steps),
            "evictions": sum(len(s.evicted) for s in self.steps),
            "finished": sum(len(s.finished) for s in self.steps),
        }

    def dumps(self) -> str:
        head = {
            "format": FORMAT,
            "recorded_with": self.recorded_with,
            "vllm_compat": self.vllm_compat,
            "summary": self.summary(),
            "workload": self.workload,
            "initial_free_queue": ids_to_text(self.initial_free_queue),
        }
        out = io.StringIO()
        out.write(json.dumps(head, separators=(",", ":"))[:-1])
        out.write(',"steps":[\n')
        out.write(",\n".join(json.dumps(s.to_json(), separators=(",", ":")) for s in self.steps))
        out.write("\n]}\n")
        return out.getvalue()

    def write(self, path: str | Path) -> Path:
        """Write as JSON, gzipped (byte-stable) when the path ends in .gz."""
        path = Path(path)
        data = self.dumps().encode()
        if path.suffix == ".gz":
            data = gzip.compress(data, compresslevel=9, mtime=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path

    @classmethod
    def loads(cls, text: str) -> DecisionLog:
        d = json.loads(text)
        if d.get("format") != FORMAT:
            raise ValueError(f"format={d.get('format')!r}: expected {FORMAT!r}")
        return cls(
            recorded_with=d["recorded_with"],
            vllm_compat=d["vllm_compat"],
            workload=d["workload"],
            initial_free_queue=text_to_ids(d["initial_free_queue"]),
            steps=[StepDecisions.from_json(s) for s in d["steps"]],
        )

    @classmethod
    def read(cls, path: str | Path) -> DecisionLog:
        """A decision file (JSON, or gzipped JSON); a file that is not one raises
        `ParityFileError` naming it and what is wrong."""
        try:
            raw = Path(path).read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            return cls.loads(raw.decode())
        except OSError as exc:
            raise ParityFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
        except (EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParityFileError(f"{path}: not a decision file ({type(exc).__name__})") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ParityFileError(
                f"{path}: not a decision file (missing or malformed {exc})"
            ) from None


def ids_to_text(ids: Sequence[int]) -> str:
    """[1, 2, 3, 4, 9, 7, 6, 5] -> "1-4,9,7-5": runs of consecutive ids, either direction."""
    parts: list[str] = []
    i, n = 0, len(ids)
    while i < n:
        j = i
        if i + 1 < n and abs(ids[i + 1] - ids[i]) == 1:
            step = ids[i + 1] - ids[i]
            while j + 1 < n and ids[j + 1] - ids[j] == step:
                j += 1
        parts.append(str(ids[i]) if j == i else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def text_to_ids(text: str) -> list[int]:
    """Inverse of `ids_to_text`."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        a, sep, b = part.partition("-")
        if not sep:
            out.append(int(a))
        else:
            lo, hi = int(a), int(b)
            out.extend(range(lo, hi + 1) if hi >= lo else range(lo, hi - 1, -1))
    return out


def free_queue_edit(
    prev: Sequence[int], cur: Sequence[int]
) -> tuple[list[int], int, list[int], list[int]] | None:
    """Encode `cur` as (head, pop, drop, tail) against `prev`; None when equal.

    The kept middle is the longest run of `cur` that appears in `prev` in the same order
    (found greedily from the run that starts with the first surviving block of `prev`).
    """
    if list(prev) == list(cur):
        return None
    pop = len(prev) - len(cur)
    if pop > 0 and prev[pop:] == cur:  # fast path: allocation only (pops at the head)
        return ([], pop, [], [])
    pos = {b: i for i, b in enumerate(prev)}
    # start of the middle: the first block of cur that sits in prev and is followed, in cur,
    # by blocks of increasing position in prev; try each candidate start, keep the longest.
    best = (0, 0)  # (start, end) in cur
    i = 0
    while i < len(cur):
        if cur[i] not in pos:
            i += 1
            continue
        j = i + 1
        while j < len(cur) and cur[j] in pos and pos[cur[j]] > pos[cur[j - 1]]:
            j += 1
        if j - i > best[1] - best[0]:
            best = (i, j)
        i = j
    start, end = best
    middle = set(cur[start:end])
    first = pos[cur[start]] if end > start else len(prev)
    drop = sorted(b for b in prev[first:] if b not in middle)
    edit = (list(cur[:start]), first, drop, list(cur[end:]))
    if apply_free_queue_edit(prev, edit) != list(cur):  # cannot happen; guards the format
        raise InternalError("free-queue edit does not reproduce the queue")
    return edit


def apply_free_queue_edit(
    prev: Sequence[int], edit: tuple[list[int], int, list[int], list[int]] | None
) -> list[int]:
    if edit is None:
        return list(prev)
    head, pop, drop, tail = edit
    gone = set(drop)
    return list(head) + [b for b in prev[pop:] if b not in gone] + list(tail)


def decode_free_queues(log: DecisionLog) -> Iterator[list[int]]:
    """The full free-queue order after each step, in step order."""
    queue = list(log.initial_free_queue)
    for step in log.steps:
        queue = apply_free_queue_edit(queue, step.free_queue_edit)
        yield queue
