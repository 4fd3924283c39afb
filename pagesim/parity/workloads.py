"""Deterministic workloads for the vLLM parity harness.

A parity workload is a list of `ParityRequest`s whose prompts are written as *segments*, so a
golden file can carry the whole workload in a few kilobytes and CI needs neither vLLM nor the
source trace:

    ["k", key, n]   the first n tokens of chunk `key` (`chunk_tokens(seed, key, n)`)
    ["o", rid]      the `max_tokens` output tokens of request `rid` (`synthetic_token`)

Equal chunk keys give equal tokens, so shared system prompts, multi-turn histories and the
Mooncake trace's `hash_ids` ("equal hash id -> equal 512 tokens") all become real shared prefixes.
A request arrives at step `arrival_step`, or, when `after` names another request, `delay` steps
after that request finished (multi-turn: the next turn is sent once the answer is complete).

Every random draw comes from `numpy.random.default_rng` seeded by the workload seed; each golden
file also stores a digest of every prompt, so a change in the token synthesis fails loudly.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from pagesim.data import workloads_dir
from pagesim.errors import WorkloadError
from pagesim.scheduler.output import synthetic_token

VOCAB_SIZE = 32000  # token ids are drawn from [0, VOCAB_SIZE)
MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake hash id (FAST'25 README)
MOONCAKE_TRACE = "traces/kvcache-ai-mooncake/conversation_trace.jsonl.gz"  # shipped


@dataclass(frozen=True)
class ParityRequest:
    """One request of a parity workload, before its tokens are synthesised."""

    request_id: str
    segments: tuple[tuple[Any, ...], ...]  # ("k", key, n) or ("o", request_id)
    max_tokens: int  # output tokens (generation ignores EOS)
    arrival_step: int = 0  # engine step at which the request is added
    after: str | None = None  # arrive `delay` steps after this request finished
    delay: int = 0
    cache_salt: str | None = None
    priority: int = 0  # lower is served first under scheduling_policy="priority"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.request_id,
            "seg": [list(s) for s in self.segments],
            "max_tokens": self.max_tokens,
            "arrive": self.arrival_step,
        }
        if self.after is not None:
            d["after"], d["delay"] = self.after, self.delay
        if self.cache_salt is not None:
            d["salt"] = self.cache_salt
        if self.priority:
            d["prio"] = self.priority
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ParityRequest:
        return cls(
            request_id=d["id"],
            segments=tuple(tuple(s) for s in d["seg"]),
            max_tokens=d["max_tokens"],
            arrival_step=d.get("arrive", 0),
            after=d.get("after"),
            delay=d.get("delay", 0),
            cache_salt=d.get("salt"),
            priority=d.get("prio", 0),
        )


@dataclass(frozen=True)
class ParityWorkload:
    """A named workload: its requests (segment form), the seed of its chunk tokens, and the
    engine settings it is meant to be replayed with (vLLM names; `num_gpu_blocks` counts
    vLLM's null block, so N blocks give N - 1 usable ones)."""

    name: str
    seed: int
    requests: tuple[ParityRequest, ...]
    engine: dict[str, Any]
    description: str = ""
    _prompts: dict[str, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "seed": self.seed,
            "description": self.description,
            "engine": dict(self.engine),
            "requests": [r.to_json() for r in self.requests],
            "prompt_digests": [prompt_digest(self.prompt(r.request_id)) for r in self.requests],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any], verify: bool = True) -> ParityWorkload:
        wl = cls(
            name=d["name"],
            seed=d["seed"],
            description=d.get("description", ""),
            engine=dict(d["engine"]),
            requests=tuple(ParityRequest.from_json(r) for r in d["requests"]),
        )
        if verify and "prompt_digests" in d:
            for req, want in zip(wl.requests, d["prompt_digests"], strict=True):
                got = prompt_digest(wl.prompt(req.request_id))
                if got != want:
                    raise WorkloadError(
                        f"prompt of {req.request_id}={got}: differs from the recorded {want} "
                        "(token synthesis changed; re-record the golden files)"
                    )
        return wl

    def request(self, request_id: str) -> ParityRequest:
        for r in self.requests:
            if r.request_id == request_id:
                return r
        raise WorkloadError(f"request_id={request_id!r}: not in workload {self.name}")

    def prompt(self, request_id: str) -> list[int]:
        """The prompt token ids of a request (memoised)."""
        if request_id not in self._prompts:
            self._prompts[request_id] = self._build(self.request(request_id))
        return self._prompts[request_id]

    def _build(self, req: ParityRequest) -> list[int]:
        tokens: list[int] = []
        for seg in req.segments:
            if seg[0] == "k":
                tokens.extend(chunk_tokens(self.seed, int(seg[1]), int(seg[2])))
            elif seg[0] == "o":
                tokens.extend(output_tokens(self.prompt(seg[1]), self.request(seg[1]).max_tokens))
            else:
                raise WorkloadError(f"segment={seg!r}: kind must be 'k' or 'o'")
        return tokens


def chunk_tokens(seed: int, key: int, n: int) -> list[int]:
    """The first `n` tokens of chunk `key`: equal (seed, key) give equal tokens, and a shorter
    chunk is a prefix of a longer one (numpy draws bounded integers one after another)."""
    rng = np.random.default_rng([seed, key])
    return rng.integers(0, VOCAB_SIZE, size=n, dtype=np.int64).tolist()


def output_tokens(prompt: Sequence[int], n: int) -> list[int]:
    """The n output tokens a request with this prompt generates (`synthetic_token`)."""
    shim = SimpleNamespace(prompt_token_ids=list(prompt))
    return [synthetic_token(shim, i) for i in range(n)]  # type: ignore[arg-type]


def prompt_digest(tokens: Sequence[int]) -> str:
    """Short stable digest of a token list (12 hex digits of sha256 over its JSON)."""
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- the named workloads


def _engine(
    num_gpu_blocks: int, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int = 4096
) -> dict[str, Any]:
    return {
        "block_size": 16,
        "num_gpu_blocks": num_gpu_blocks,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "long_prefill_token_threshold": 0,
        "scheduling_policy": "fcfs",
        "scheduler_reserve_full_isl": True,
    }


def shared_prefix(seed: int = 1) -> ParityWorkload:
    """160 requests behind four system prompts of 200/333/480/700 tokens (not block-aligned),
    with unique user turns of 8-256 tokens; 1 in 8 requests carries a tenant `cache_salt`,
    and some repeat an earlier prompt exactly (a full hit is capped one block short)."""
    rng = np.random.default_rng(seed)
    sys_len = [200, 333, 480, 700]
    reqs: list[ParityRequest] = []
    step = 0
    for i in range(160):
        step += int(rng.poisson(0.6))
        s = int(rng.integers(0, 4))
        salt = f"tenant{int(rng.integers(0, 2))}" if rng.random() < 0.125 else None
        max_tokens = int(rng.integers(4, 97))
        if i >= 8 and rng.random() < 0.1:  # an exact repeat of an earlier prompt
            src = reqs[int(rng.integers(0, len(reqs)))]
            segs, salt = src.segments, src.cache_salt
        else:
            segs = (("k", s, sys_len[s]), ("k", 1000 + i, int(rng.integers(8, 257))))
        reqs.append(ParityRequest(f"r{i}", segs, max_tokens, arrival_step=step, cache_salt=salt))
    return ParityWorkload(
        "shared_prefix", seed, tuple(reqs), _engine(400, 1024, 32), shared_prefix.__doc__ or ""
    )


def multi_turn(seed: int = 2) -> ParityWorkload:
    """24 chat sessions of 2-6 turns: each turn's prompt is the previous prompt, its answer
    (synthetic tokens) and a new user message of 16-200 tokens; a turn is sent 0-8 steps after
    the previous answer finished, so the history's decode blocks are prefix hits."""
    rng = np.random.default_rng(seed)
    reqs: list[ParityRequest] = []
    key = 0
    for s in range(24):
        start = int(rng.integers(0, 40))
        prev: ParityRequest | None = None
        for t in range(int(rng.integers(2, 7))):
            key += 1
            user = ("k", key, int(rng.integers(16, 201) if prev else rng.integers(64, 401)))
            max_tokens = int(rng.integers(8, 121))
            rid = f"s{s}t{t}"
            if prev is None:
                req = ParityRequest(rid, (user,), max_tokens, arrival_step=start)
            else:
                segs = prev.segments + (("o", prev.request_id), user)
                req = ParityRequest(
                    rid, segs, max_tokens, after=prev.request_id, delay=int(rng.integers(0, 9))
                )
            reqs.append(req)
            prev = req
    return ParityWorkload(
        "multi_turn", seed, tuple(reqs), _engine(1024, 1024, 32), multi_turn.__doc__ or ""
    )


def random_pressure(seed: int = 3) -> ParityWorkload:
    """200 requests of 32-900 prompt and 16-400 output tokens arriving over ~20 steps into 255
    usable blocks (4080 tokens): constant preemption. 30% start with one of 8 random prefixes."""
    rng = np.random.default_rng(seed)
    reqs: list[ParityRequest] = []
    for i in range(200):
        n = int(rng.integers(32, 901))
        segs: tuple[tuple[Any, ...], ...] = (("k", 100 + i, n),)
        if rng.random() < 0.3:
            p = int(rng.integers(0, 8))
            segs = (("k", p, 40 + 37 * p),) + segs
        reqs.append(
            ParityRequest(
                f"r{i}", segs, int(rng.integers(16, 401)), arrival_step=int(rng.integers(0, 21))
            )
        )
    return ParityWorkload(
        "random_pressure", seed, tuple(reqs), _engine(256, 512, 64), random_pressure.__doc__ or ""
    )


def priority_pressure(seed: int = 5) -> ParityWorkload:
    """`random_pressure` under scheduling_policy="priority": 120 requests with priorities 0-2
    (lower first) arriving over ~30 steps; victims are the lowest-priority latest arrivals."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(120):
        n = int(rng.integers(32, 901))
        reqs.append(
            ParityRequest(
                f"r{i}",
                (("k", 100 + i, n),),
                int(rng.integers(16, 301)),
                arrival_step=int(rng.integers(0, 31)),
                priority=int(rng.integers(0, 3)),
            )
        )
    reqs.sort(key=lambda r: r.arrival_step)  # the order requests are added within a step
    engine = dict(_engine(256, 512, 64), scheduling_policy="priority")
    return ParityWorkload(
        "priority_pressure", seed, tuple(reqs), engine, priority_pressure.__doc__ or ""
    )


def priority_self_preempt(seed: int = 0) -> ParityWorkload:
    """Priority scheduling where a request is its own preemption victim. In each of three
    rounds a low-priority request is admitted first, so it leads the running list, and a
    high-priority one fills the rest of a 14-block pool. The low one's next token needs a
    block first; it is the lowest priority running, so vLLM preempts it, schedules nothing
    else that step, and runs the other one the next step."""
    reqs = []
    for k in range(3):
        start = 300 * k
        reqs.append(ParityRequest(f"low{k}", (("k", 400 + k, 111),), 100, start, priority=2))
        reqs.append(ParityRequest(f"high{k}", (("k", 500 + k, 97),), 100, start + 1, priority=0))
    engine = dict(_engine(15, 512, 16), scheduling_policy="priority")
    return ParityWorkload(
        "priority_self_preempt", seed, tuple(reqs), engine, priority_self_preempt.__doc__ or ""
    )


def rollout(seed: int = 6) -> ParityWorkload:
    """Parallel sampling as vLLM v1's frontend serves n > 1: 24 prompts of 100-600 tokens, each
    fanned out into 8 child requests `<k>_<prompt>` added together (prompts arriving over ~40
    steps), 64-256 output tokens; the later samples hit the blocks the first one cached, also
    within its admission step, and the pool of 511 usable blocks forces preemptions."""
    rng = np.random.default_rng(seed)
    reqs: list[ParityRequest] = []
    step = 0
    for i in range(24):
        step += int(rng.integers(0, 4))
        segs = (("k", 10 + i, int(rng.integers(100, 601))),)
        max_tokens = int(rng.integers(64, 257))
        reqs.extend(
            ParityRequest(f"{k}_p{i}", segs, max_tokens, arrival_step=step) for k in range(8)
        )
    return ParityWorkload(
        "rollout", seed, tuple(reqs), _engine(512, 1024, 64), rollout.__doc__ or ""
    )


def mooncake_slice(
    trace_path: str | Path,
    num_requests: int = 200,
    max_model_len: int = 16384,
    step_ms: int = 50,
    seed: int = 4,
) -> ParityWorkload:
    """The first `num_requests` rows of Mooncake's conversation trace whose prompt + output fit
    in `max_model_len`; hash id h becomes 512 tokens of chunk h (the last block of a prompt
    takes the first input_length mod 512 of them); arrival step = timestamp_ms // step_ms."""
    reqs: list[ParityRequest] = []
    opener = gzip.open if str(trace_path).endswith(".gz") else open
    with opener(trace_path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            n_in, n_out, hashes = row["input_length"], row["output_length"], row["hash_ids"]
            if n_in + n_out > max_model_len:
                continue
            segs = []
            for j, h in enumerate(hashes):
                n = min(MOONCAKE_BLOCK_TOKENS, n_in - j * MOONCAKE_BLOCK_TOKENS)
                segs.append(("k", int(h), n))
            reqs.append(
                ParityRequest(
                    f"m{len(reqs)}",
                    tuple(segs),
                    int(n_out),
                    arrival_step=int(row["timestamp"]) // step_ms,
                )
            )
            if len(reqs) == num_requests:
                break
    return ParityWorkload(
        "mooncake",
        seed,
        tuple(reqs),
        _engine(4096, 2048, 64, max_model_len=max_model_len),
        mooncake_slice.__doc__ or "",
    )


def default_trace_path() -> Path:
    """The Mooncake conversation trace shipped with the workloads."""
    return workloads_dir() / MOONCAKE_TRACE


WORKLOADS: dict[str, Callable[[], ParityWorkload]] = {
    "shared_prefix": shared_prefix,
    "multi_turn": multi_turn,
    "random_pressure": random_pressure,
    "priority_pressure": priority_pressure,
    "priority_self_preempt": priority_self_preempt,
    "mooncake": lambda: mooncake_slice(default_trace_path()),
    "rollout": rollout,
}


# Hybrid layouts: the KV cache groups vLLM forms for the model family, in group order, as
# ["full"] or ["sliding", window tokens] (`kv_cache_groups` of a workload's engine; absent:
# one full-attention group). Windows are the families' own.
GPT_OSS_GROUPS = [["sliding", 128], ["full"]]  # gpt-oss: alternating, window 128
GEMMA2_GROUPS = [["sliding", 4096], ["full"]]  # Gemma 2: alternating, window 4096
GEMMA3_GROUPS = [["sliding", 1024]] * 5 + [["full"]]  # Gemma 3: 5 sliding : 1 full, window 1024

# golden case -> (workload, engine overrides): the files under tests/parity/golden/
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "shared_prefix": ("shared_prefix", {}),
    "multi_turn": ("multi_turn", {}),
    "random_pressure": ("random_pressure", {}),
    "mooncake": ("mooncake", {}),
    "priority_pressure": ("priority_pressure", {}),
    "priority_self_preempt": ("priority_self_preempt", {}),
    # the admission gate off: a waiting request is admitted when its first chunk fits
    "random_pressure_no_full_isl": ("random_pressure", {"scheduler_reserve_full_isl": False}),
    "rollout": ("rollout", {}),
    "gpt_oss_rollout": ("rollout", {"kv_cache_groups": GPT_OSS_GROUPS}),
    "gpt_oss_shared_prefix": ("shared_prefix", {"kv_cache_groups": GPT_OSS_GROUPS}),
    "gpt_oss_random_pressure": ("random_pressure", {"kv_cache_groups": GPT_OSS_GROUPS}),
    "gemma2_mooncake": ("mooncake", {"kv_cache_groups": GEMMA2_GROUPS}),
    "gemma3_multi_turn": ("multi_turn", {"kv_cache_groups": GEMMA3_GROUPS}),
}


def case_workload(case: str) -> ParityWorkload:
    """The workload of a golden case, with its engine overrides applied."""
    if case not in CASES:
        raise WorkloadError(f"case={case!r}: choose one of {', '.join(CASES)}")
    name, overrides = CASES[case]
    wl = WORKLOADS[name]()
    return ParityWorkload(case, wl.seed, wl.requests, dict(wl.engine, **overrides), wl.description)


def golden_name(case: str, version: str) -> str:
    return f"{case}.vllm-{version}.json.gz"
