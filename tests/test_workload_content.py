"""Prompt contents: Mooncake hash_ids sharing, system-prompt groups, cache salts, no
accidental first-block collisions, multi-turn prompt extension, determinism."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pagesim.errors import WorkloadError
from pagesim.kvcache.hashing import BlockHasher
from pagesim.request import Request
from pagesim.workload import RequestPlan, load_workload

ROWS = [  # (input_length, hash_ids): shared full blocks, a shared partial last block, no sharing
    (1300, [0, 1, 2]),
    (1100, [0, 1, 3]),
    (600, [0, 4]),
    (100, [5]),
    (1536, [0, 1, 2]),
    (1200, [0, 1, 2]),
    (40, [6]),
    (30, [6]),
]


def _mooncake(tmp_path: Path) -> str:
    path = tmp_path / "m.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"timestamp": 100 * k, "input_length": n, "output_length": 4, "hash_ids": ids}
            )
            + "\n"
            for k, (n, ids) in enumerate(ROWS)
        )
    )
    return str(path)


def _block_hashes(tokens: list[int], block_size: int, salt: str | None = None) -> list[bytes]:
    req = Request("x", tokens, max_tokens=1, cache_salt=salt)
    BlockHasher(block_size).extend(req)
    return req.block_hashes


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


def _expected_common(i: int, j: int) -> int:
    """Tokens two Mooncake prompts share: whole equal leading blocks, and in the first block
    where they stop, the shorter partial prefix if that block's id is equal."""
    (ni, ids_i), (nj, ids_j) = ROWS[i], ROWS[j]
    shared = 0
    for k, (a, b) in enumerate(zip(ids_i, ids_j, strict=False)):
        if a != b:
            break
        shared = min(ni, nj, (k + 1) * 512)
    return shared


def test_equal_hash_ids_give_equal_tokens(tmp_path: Path) -> None:
    plan = load_workload(_mooncake(tmp_path)).sample(len(ROWS), seed=0)
    prompts = [plan.materialize(i) for i in range(len(ROWS))]
    assert [len(p) for p in prompts] == [n for n, _ in ROWS]
    for i in range(len(ROWS)):
        for j in range(i):
            assert _common_prefix(prompts[i], prompts[j]) == _expected_common(i, j), (i, j)
    block_2 = {tuple(prompts[0][1024:1300])}  # id 2's partial block in row 0
    assert tuple(prompts[4][1024:1300]) in block_2  # ... is a prefix of id 2's full block


@pytest.mark.parametrize("block_size", [16, 32, 512])
def test_block_sharing_equals_the_traces(tmp_path: Path, block_size: int) -> None:
    """With any block size dividing 512, a prompt's cached-prefix blocks (chained hashes seen
    before, unbounded cache) are exactly the blocks its leading ids share with earlier rows."""
    plan = load_workload(_mooncake(tmp_path)).sample(len(ROWS), seed=4)
    seen: set[bytes] = set()
    for i in range(len(ROWS)):
        hashes = _block_hashes(plan.materialize(i), block_size)
        hit = next((k for k, h in enumerate(hashes) if h not in seen), len(hashes))
        expected = max((_expected_common(i, j) for j in range(i)), default=0) // block_size
        assert hit == expected, (i, hit, expected)
        seen.update(hashes)


def test_trace_laps_do_not_share(tmp_path: Path) -> None:
    plan = load_workload(_mooncake(tmp_path)).sample(2 * len(ROWS), seed=0)
    first, again = plan.materialize(0), plan.materialize(len(ROWS))
    assert len(first) == len(again) and first[:16] != again[:16]
    assert plan.trace_times_s[len(ROWS)] > plan.trace_times_s[len(ROWS) - 1]


def test_unshared_prompts_never_collide_in_their_first_block() -> None:
    plan = load_workload("chat").sample(3000, seed=0)
    firsts = {tuple(plan.materialize(i)[:2]) for i in range(3000)}
    assert len(firsts) == 3000  # distinct within two tokens: no block of >= 2 tokens collides


def test_system_prompt_groups_share_exactly_the_prefix() -> None:
    plan = load_workload("system-prompt").sample(400, seed=0)
    by_group: dict[int, list[int]] = {}
    for i in range(400):
        by_group.setdefault(int(plan.prefix_roots[i]), []).append(i)
    assert len(by_group) > 3
    prompts = {i: plan.materialize(i) for i in range(400)}
    for members in by_group.values():
        p = int(plan.prefix_lens[members[0]])
        assert 512 <= p <= 2048 and all(plan.prefix_lens[m] == p for m in members)
        for a, b in zip(members, members[1:], strict=False):
            assert _common_prefix(prompts[a], prompts[b]) == p
    g1, g2 = (members[0] for members in list(by_group.values())[:2])
    assert _common_prefix(prompts[g1], prompts[g2]) == 0


def test_tenants_get_salts_that_split_the_cache(tmp_path: Path) -> None:
    spec = tmp_path / "t.yaml"
    spec.write_text(
        "lengths: {input: 64, output: 4}\nprefix: {groups: 1, length: 64}\ntenants: {count: 3}\n"
    )
    plan = load_workload(str(spec)).sample(60, seed=0)
    assert plan.tenant_salts == ("t/tenant-0", "t/tenant-1", "t/tenant-2")
    reqs = [plan.make_request(i, 0.0) for i in range(60)]
    assert {r.cache_salt for r in reqs} == set(plan.tenant_salts)
    first = {}
    for r in reqs:  # same prefix tokens; the salt makes the first block hash differ by tenant
        first.setdefault(r.cache_salt, set()).add(
            _block_hashes(r.prompt_token_ids, 16, r.cache_salt)[0]
        )
    assert all(len(h) == 1 for h in first.values())
    assert len(set().union(*first.values())) == 3


def _finish(req: Request) -> None:
    req.output_token_ids = [
        (7 * k + len(req.prompt_token_ids)) % 32000 for k in range(req.max_tokens)
    ]


def test_multi_turn_prompts_extend_the_history() -> None:
    plan = load_workload("multi-turn").sample(300, seed=2)
    assert plan.is_multi_turn and plan.arrival.process == "poisson"
    assert np.all(plan.think_time_s[plan.first_turns] == 0)
    for s in range(plan.num_sessions):
        sess = plan.session(s)
        idx = list(sess.request_indices)
        assert plan.turns[idx].tolist() == list(range(len(idx)))
        req = sess.first_request(arrival_time=0.0)
        assert len(req.prompt_token_ids) == plan.prompt_lens[idx[0]]
        for i in idx[1:]:
            _finish(req)
            assert sess.next_think_time_s() == plan.think_time_s[i] >= 0
            nxt = sess.next_request(req, arrival_time=1.0)
            assert nxt.prompt_token_ids[: req.num_tokens] == req.all_token_ids
            assert (
                len(nxt.prompt_token_ids)
                == plan.prompt_lens[i]
                == req.num_tokens + plan.user_lens[i]
            )
            assert nxt.session_id == req.session_id == f"session-{s}"
            assert (
                nxt.prompt_token_ids[: plan.prefix_lens[i]]
                == plan.materialize(0)[: plan.prefix_lens[i]]
            )
            req = nxt
        assert not sess.has_next()
    capped = plan.prompt_lens[plan.turns > 0] + plan.output_lens[plan.turns > 0]
    assert capped.max() <= 4096  # a session ends before exceeding max_context_tokens


def test_later_turns_cannot_be_materialized_alone() -> None:
    plan = load_workload("multi-turn").sample(50, seed=0)
    later = int(np.flatnonzero(plan.turns > 0)[0])
    with pytest.raises(WorkloadError, match="Session.next_prompt"):
        plan.materialize(later)


def test_mix_splits_by_weight_and_keeps_contents_apart() -> None:
    plan = load_workload("mix").sample(1000, seed=0)
    assert plan.arrival.process == "poisson" and plan.arrival.rate == 4.0
    prefixed = int((plan.prefix_lens > 0).sum())
    assert prefixed == 200  # 20% system-prompt requests (largest-remainder split)
    roots = np.concatenate([plan.user_roots, plan.prefix_roots[plan.prefix_lens > 0]])
    assert len(np.unique(plan.user_roots)) == 1000
    assert roots.max() < plan.num_roots
    assert not np.array_equal(plan.prefix_lens[:200] > 0, np.ones(200, bool))  # interleaved


def _digest(plan: RequestPlan, n: int) -> str:
    h = hashlib.sha256()
    for name in (
        "prompt_lens",
        "output_lens",
        "prefix_lens",
        "prefix_roots",
        "user_lens",
        "user_roots",
        "block_offsets",
        "block_roots",
        "tenants",
        "sessions",
        "turns",
        "think_time_s",
        "session_offsets",
        "token_table",
    ):
        h.update(getattr(plan, name).tobytes())
    for i in plan.first_turns[:n].tolist():
        h.update(np.asarray(plan.materialize(i), dtype=np.int64).tobytes())
    return h.hexdigest()


NAMES = ["mix", "multi-turn", "mooncake-synthetic"]
DIGEST_SNIPPET = """
import sys
sys.path.insert(0, {tests!r})
from test_workload_content import NAMES, _digest
from pagesim.workload import load_workload
for name in NAMES:
    print(_digest(load_workload(name).sample(300, seed=5), 40))
"""


def test_same_seed_same_plan_in_any_process() -> None:
    here = [_digest(load_workload(name).sample(300, seed=5), 40) for name in NAMES]
    assert here == [_digest(load_workload(name).sample(300, seed=5), 40) for name in NAMES]
    assert here[0] != _digest(load_workload(NAMES[0]).sample(300, seed=6), 40)
    code = DIGEST_SNIPPET.format(tests=str(Path(__file__).parent))
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert out.stdout.split() == here


def test_vocab_must_tell_all_roots_apart() -> None:
    with pytest.raises(WorkloadError, match="vocab_size = 10: too small for 200"):
        load_workload("chat").sample(200, vocab_size=10)
    plan = load_workload("chat").sample(90, vocab_size=10)  # 90 roots < 10**2: still distinct
    assert len({tuple(plan.materialize(i)[:2]) for i in range(90)}) == 90
