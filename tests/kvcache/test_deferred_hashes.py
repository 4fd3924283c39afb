"""Deferred hashes (`pagesim.sim.deferred_hashes`) make the decisions eager hashing makes.

Two managers run the same random program: the eager one through `allocate_slots` only, the
deferred one through the calls of bulk decodes where they apply (`append_decode_blocks`,
`cache_decode_block` with the request's tokens not appended yet, as the simulator does). Every
call must return the same blocks; whenever the program looks, the whole state read through the
public API must be the same (rows, ref counts, free-queue order with each block's hash, the hash
map's content, every deferred block registered first), and the deferred side's request hashes
a prefix of the eager ones. The deferred manager runs its invariant checker after every call.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kv_helpers import make_manager, make_request

from pagesim.request import Request
from pagesim.sim.deferred_hashes import DeferredHashTable


class _Side:
    """One manager and its copies of the requests."""

    def __init__(self, deferred: bool, num_blocks: int, bs: int, compat: str) -> None:
        self.mgr = make_manager(
            num_blocks,
            bs,
            deferred_hashes=DeferredHashTable if deferred else None,
            check_invariants=deferred,
            vllm_compat=compat,
        )
        self.deferred = deferred
        self.requests: dict[str, Request] = {}
        self.lag: dict[str, list[int]] = {}  # tokens the deferred side has not appended yet

    def sync(self, rid: str) -> None:
        self.requests[rid].output_token_ids.extend(self.lag.pop(rid, []))

    def admit(self, rid: str):
        req = self.requests[rid]
        self.sync(rid)
        hit, num_hit = self.mgr.get_computed_blocks(req)
        new = self.mgr.allocate_slots(
            req, req.num_tokens - num_hit, num_new_computed_tokens=num_hit, new_computed_blocks=hit
        )
        if new is None:
            return hit.get_block_ids(), None
        req.num_computed_tokens = req.num_tokens
        return hit.get_block_ids(), new.get_block_ids(), num_hit

    def decode(self, rid: str):
        req, mgr = self.requests[rid], self.mgr
        bs = mgr.block_size
        c = req.num_computed_tokens
        n_out = len(req.output_token_ids) + len(self.lag.get(rid, ()))
        token = (c + n_out) % 3  # equal prompts decode equal tokens: duplicate blocks
        prompt_len = len(req.prompt_token_ids)
        row = mgr.req_to_block_ids[rid]
        if self.deferred and c == len(row) * bs and (c + 1) % bs:
            ok = mgr.append_decode_blocks([rid])
        elif (
            self.deferred
            and c != len(row) * bs
            and (c + 1) % bs == 0
            and c + 1 - bs >= prompt_len
            and c + 1 - bs > 0
        ):
            self.lag.setdefault(rid, []).append(token)
            first = c + 1 - bs - prompt_len
            tokens = (req.output_token_ids + self.lag[rid])[first : first + bs]
            mgr.cache_decode_block(req, struct.pack(f"<{bs}i", *tokens))
            req.num_computed_tokens += 1
            return True
        elif self.deferred and c != len(row) * bs and (c + 1) % bs:
            ok = True  # allocate_slots would change nothing
        else:
            self.sync(rid)
            req.output_token_ids.append(token)
            ok = mgr.allocate_slots(req, 1) is not None
            if not ok:
                req.output_token_ids.pop()
                return False
            req.num_computed_tokens += 1
            return True
        if ok:
            self.lag.setdefault(rid, []).append(token)
            req.num_computed_tokens += 1
        return ok

    def free(self, rid: str) -> None:
        self.sync(rid)
        req = self.requests[rid]
        self.mgr.free(req)
        req.num_computed_tokens = 0  # preempted (recompute): may be admitted again

    def state(self) -> tuple:
        pool = self.mgr.block_pool
        if self.deferred:
            self.mgr.deferred_hashes.materialize_all()
        cache = {
            h: (b.block_id if not isinstance(b, dict) else tuple(b))
            for h, b in pool.cached_block_hash_to_block.items()
        }
        return (
            dict(self.mgr.req_to_block_ids),
            dict(self.mgr.num_cached_block),
            cache,
            [(b.block_id, b.block_hash) for b in pool.free_block_queue.get_all_free_blocks()],
            [(b.ref_cnt, b.block_hash) for b in pool.blocks],
        )


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "decode", "decode", "decode", "free", "look"]), st.integers(0, 3)
    ),
    min_size=5,
    max_size=90,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bs=st.sampled_from([2, 4]),
    num_blocks=st.integers(29, 60),
    ops=_OPS,
    compat=st.sampled_from(["0.33", "0.23"]),
    prompts=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.sampled_from([1, 3, 4, 5, 8, 9, 13]),
            st.sampled_from([None, None, None, "t1"]),
        ),
        min_size=4,
        max_size=4,
    ),
)
def test_deferred_hashes_match_eager(bs, num_blocks, ops, compat, prompts) -> None:
    # (any one request fits: at most 13 + 40 tokens, 27 blocks of 2, with the null block)
    eager, deferred = _Side(False, num_blocks, bs, compat), _Side(True, num_blocks, bs, compat)
    for i, (family, length, salt) in enumerate(prompts):
        prompt = [(family * 7 + j) % 5 for j in range(length)]  # few distinct: many shared blocks
        for side in (eager, deferred):
            side.requests[f"r{i}"] = make_request(f"r{i}", prompt, max_tokens=40, cache_salt=salt)
    for op, k in ops:
        rid = f"r{k}"
        running = rid in eager.mgr.req_to_block_ids
        if op == "admit" and not running:
            assert eager.admit(rid) == deferred.admit(rid)
        elif op == "decode" and running:
            assert eager.decode(rid) == deferred.decode(rid)
        elif op == "free" and running:
            eager.free(rid)
            deferred.free(rid)
        elif op == "look":
            assert eager.state() == deferred.state()
    assert eager.state() == deferred.state()
    for rid, req in deferred.requests.items():
        full = eager.requests[rid].block_hashes
        assert req.block_hashes == full[: len(req.block_hashes)]


def test_deferred_hashes_skip_unshared_blocks() -> None:
    """A request whose first block nobody else has: only that block is hashed, and reading a
    deferred block's hash needs it registered first, with the eager value."""
    mgr = make_manager(20, 4, deferred_hashes=DeferredHashTable)
    eager = make_manager(20, 4)
    reqs = [make_request("a", list(range(13))), make_request("a", list(range(13)))]
    for m, r in zip((mgr, eager), reqs, strict=True):
        hit, n = m.get_computed_blocks(r)
        assert m.allocate_slots(r, 13, n, hit) is not None
    assert len(reqs[0].block_hashes) == 1 and len(reqs[1].block_hashes) == 3
    assert len(mgr.block_pool.cached_block_hash_to_block) == 1  # the first block only
    row = mgr.req_to_blocks["a"]
    placeholder = row[2].block_hash  # bytes that are no key of the map
    assert placeholder is not None and placeholder not in mgr.block_pool.cached_block_hash_to_block
    mgr.deferred_hashes.materialize_all()
    assert row[2].block_hash == reqs[1].block_hashes[2]  # the eager value
    assert reqs[0].block_hashes == reqs[1].block_hashes
    assert list(mgr.block_pool.cached_block_hash_to_block) == list(
        eager.block_pool.cached_block_hash_to_block
    )


def test_deferred_hashes_keep_the_order_of_duplicates() -> None:
    """Two requests with one prompt decode equal tokens: each decode block has a twin, and the
    first registered must stay first (lookups return it) after deferred registration."""
    eager, deferred = _Side(False, 40, 2, "0.33"), _Side(True, 40, 2, "0.33")
    for side in (eager, deferred):
        for rid in "ab":
            side.requests[rid] = make_request(rid, [1, 2, 3], max_tokens=40)
        side.admit("a")
        side.admit("b")
    for _ in range(6):
        for side in (eager, deferred):
            side.decode("a")
            side.decode("b")
    assert (
        len(deferred.mgr.deferred_hashes.groups) == 1
    )  # nothing registered past the first blocks yet
    state = eager.state()
    assert sum(isinstance(v, tuple) for v in state[2].values()) >= 3  # duplicates, in order
    assert deferred.state() == state
