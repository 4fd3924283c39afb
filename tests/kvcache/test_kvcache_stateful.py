"""Stateful property tests (hypothesis) of the block pool and the KV cache manager.

PoolMachine drives a BlockPool against a trivially correct model: the free queue as a Python
list, ref counts and the hash map as dicts. ManagerMachine drives a KVCacheManager with random
requests that share prefixes (admit with chunking and the full-sequence gate, grow, fork, free),
or a HybridKVCacheManager over KV cache groups of a hybrid layout (full attention and sliding
windows, one row per group; no fork), with the invariant checker after every call, and keeps a shadow copy of what the GPU would have
written into every block slot: every computed token of every live request must be readable
through its block table, no request may ever write into a block another request holds, and
copy-on-write copies must carry the written tokens over.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kv_helpers import snapshot

from pagesim.errors import AllocationError, InternalError
from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.block_pool import FREE_ORDERS, BlockPool
from pagesim.kvcache.hybrid_kv_cache_manager import HybridKVCacheManager
from pagesim.kvcache.invariants import check_block_pool
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.kv_cache_spec import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from pagesim.request import Request

FAST = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class PoolMachine(RuleBasedStateMachine):
    @initialize(
        num_gpu_blocks=st.integers(2, 14),
        free_order=st.sampled_from(FREE_ORDERS),
        enable_caching=st.booleans(),
    )
    def setup(self, num_gpu_blocks, free_order, enable_caching):
        self.pool = BlockPool(num_gpu_blocks, enable_caching, free_order)
        self.lifo = free_order == "lifo_unhashed"
        self.caching = enable_caching
        self.queue = list(range(1, num_gpu_blocks))  # the model of the free queue
        self.ref = {i: 0 for i in range(1, num_gpu_blocks)}
        self.hash_of: dict[int, bytes] = {}
        self.by_hash: dict[bytes, list[int]] = {}  # insertion order: the first is returned
        self.held: list[list[KVCacheBlock]] = []

    @rule(n=st.integers(0, 6))
    def allocate(self, n):
        if n > len(self.queue):
            try:
                self.pool.get_new_blocks(n)
            except InternalError:
                return
            raise AssertionError("over-allocation did not raise")
        got = self.pool.get_new_blocks(n)
        expected, self.queue = self.queue[:n], self.queue[n:]
        assert [b.block_id for b in got] == expected
        for block_id in expected:
            self.ref[block_id] = 1
            old = self.hash_of.pop(block_id, None)
            if old is not None:  # lazy eviction on reuse
                self.by_hash[old].remove(block_id)
                if not self.by_hash[old]:
                    del self.by_hash[old]
        if got:
            self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def cache(self, data):
        blocks = data.draw(st.sampled_from(self.held))
        hashes = [bytes([data.draw(st.integers(0, 3))]) * 16 for _ in blocks]
        end = data.draw(st.integers(0, len(blocks)))
        self.pool.cache_full_blocks(blocks, hashes, 0, end)
        if not self.caching:
            return
        for block, block_hash in zip(blocks[:end], hashes[:end], strict=True):
            if block.block_id not in self.hash_of:
                self.hash_of[block.block_id] = block_hash
                self.by_hash.setdefault(block_hash, []).append(block.block_id)

    @precondition(lambda self: self.by_hash)
    @rule(data=st.data())
    def hit(self, data):
        block_hash = data.draw(st.sampled_from(sorted(self.by_hash)))
        block = self.pool.get_cached_block(block_hash)
        assert block.block_id == self.by_hash[block_hash][0]
        if self.ref[block.block_id] == 0:
            self.queue.remove(block.block_id)
        self.ref[block.block_id] += 1
        self.pool.touch([block])
        self.held.append([block])

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data):
        blocks = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        head, tail = [], []
        for block in reversed(blocks):
            self.ref[block.block_id] -= 1
            if self.ref[block.block_id] == 0:
                unhashed = block.block_id not in self.hash_of
                (head if self.lifo and unhashed else tail).append(block.block_id)
        self.queue = head + self.queue + tail
        self.pool.free_blocks(reversed(blocks))

    @invariant()
    def matches_the_model(self):
        assert [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()] == self.queue
        assert {i: self.pool.blocks[i].ref_cnt for i in self.ref} == self.ref
        for block_hash, block_ids in self.by_hash.items():
            assert self.pool.get_cached_block(block_hash).block_id == block_ids[0]
        check_block_pool(self.pool)


PREFIXES = [list(range(100, 112)), list(range(200, 209)), [300, 301, 302, 303, 304], []]
BS = 4
MAX_LEN = 36
# Hybrid layouts: windows per group in group order (None: full attention).
LAYOUTS = {"alternating": (True, None), "full-first, two windows": (None, True, True)}


class ManagerMachine(RuleBasedStateMachine):
    @initialize(
        num_gpu_blocks=st.integers(3, 16),
        compat=st.sampled_from(["0.33", "0.23"]),
        caching=st.booleans(),
        window=st.sampled_from([None, None, 5, 8]),
        layout=st.sampled_from([None, None, *LAYOUTS]),
        max_num_batched_tokens=st.sampled_from([None, 8]),
    )
    def setup(self, num_gpu_blocks, compat, caching, window, layout, max_num_batched_tokens):
        self.mgr: KVCacheManager | HybridKVCacheManager
        if layout is None:
            self.mgr = KVCacheManager(
                num_gpu_blocks,
                BS,
                enable_caching=caching,
                sliding_window=window,
                vllm_compat=compat,
                check_invariants=True,
            )
            self.windows: tuple[int | None, ...] = (window,)
        else:
            w = window or 5
            self.windows = tuple(w if sliding else None for sliding in LAYOUTS[layout])
            groups = tuple(
                KVCacheGroupSpec(
                    1, FullAttentionSpec(BS) if g is None else SlidingWindowSpec(BS, g)
                )
                for g in self.windows
            )
            self.mgr = HybridKVCacheManager(
                KVCacheConfig(num_gpu_blocks, groups),
                enable_caching=caching,
                vllm_compat=compat,
                check_invariants=True,
                max_num_batched_tokens=max_num_batched_tokens,
            )
        self.hybrid = layout is not None
        self.live: dict[str, Request] = {}
        self.shadow: dict[int, list[int | None]] = {}  # block id -> token written per slot
        self.count = 0

    def _rows(self, rid: str) -> list[tuple[list[int], int | None]]:
        """The request's block-table rows with their windows (one per KV cache group)."""
        if self.hybrid:
            return list(zip(self.mgr.get_block_ids(rid), self.windows, strict=True))
        return [(self.mgr.get_block_ids(rid), self.windows[0])]

    def _new_id(self) -> str:
        self.count += 1
        return f"r{self.count}"

    def _compute(self, req: Request, start: int, n: int) -> None:
        """Write tokens [start, start + n) through the block table, as the GPU would."""
        for src, dst in self.mgr.take_blocks_to_copy():
            self.shadow[dst] = list(self.shadow[src])
        tokens = req.all_token_ids
        for row, window in self._rows(req.request_id):
            if window is not None:  # the first query (at `start`) sees start - W + 1 .. start
                for pos in range(max(0, start - window + 1), start):
                    assert row[pos // BS] != 0, f"{req.request_id}: token {pos} left the table"
            for pos in range(start, start + n):
                block_id = row[pos // BS]
                assert block_id != 0, "a token would be written to the null block"
                assert self.mgr.block_pool.blocks[block_id].ref_cnt == 1, (
                    f"block {block_id} is shared but {req.request_id} writes into it"
                )
                self.shadow.setdefault(block_id, [None] * BS)[pos % BS] = tokens[pos]
        req.num_computed_tokens = start + n

    @rule(
        prefix=st.sampled_from(range(len(PREFIXES))),
        suffix=st.lists(st.integers(0, 3), max_size=12),
        chunk=st.integers(1, 16),
        salt=st.sampled_from([None, None, "s"]),
        gate=st.booleans(),
    )
    def admit(self, prefix, suffix, chunk, salt, gate):
        req = Request(self._new_id(), (PREFIXES[prefix] + suffix) or [7], 8, cache_salt=salt)
        hit, num_hit = self.mgr.get_computed_blocks(req)
        assert num_hit % BS == 0 and num_hit <= req.num_tokens - 1
        assert len(hit) * BS == num_hit
        groups = hit.blocks if self.hybrid else (hit.blocks,)
        for g, blocks in enumerate(groups):  # a group's blocks carry its key (hash + group id)
            assert len(blocks) == len(hit)
            key = g.to_bytes(2, "big") if self.hybrid else b""
            for i, block in enumerate(blocks):
                assert block.is_null or block.block_hash == req.block_hashes[i] + key
        if self.hybrid and num_hit:  # the hit rule: a length every spec's own lookup accepts
            coordinator = self.mgr.coordinator
            for _, group_ids in coordinator.attention_groups:
                members = [coordinator.single_type_managers[g] for g in group_ids]
                finder = type(members[0]).find_longest_cache_hit
                assert finder(members, req.block_hashes, num_hit)[1] == num_hit
        before = snapshot(self.mgr)
        num_new = min(chunk, req.num_tokens - num_hit)
        try:
            new = self.mgr.allocate_slots(req, num_new, num_hit, hit, full_sequence_must_fit=gate)
        except AllocationError:
            assert snapshot(self.mgr) == before
            return
        if new is None:
            assert snapshot(self.mgr) == before
            return
        self.live[req.request_id] = req
        self._compute(req, num_hit, num_new)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 6), token=st.integers(0, 3))
    def step(self, data, n, token):
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if req.num_computed_tokens == req.num_tokens:
            if req.num_tokens >= MAX_LEN:
                return
            req.output_token_ids.append(token)
        n = min(n, req.num_tokens - req.num_computed_tokens)
        before = snapshot(self.mgr)
        try:
            new = self.mgr.allocate_slots(req, n)
        except AllocationError:
            assert snapshot(self.mgr) == before
            self._free(req)
            return
        if new is None:
            if all(w is None for w in self.windows):
                assert snapshot(self.mgr) == before
            self._free(req)  # preempted, as a scheduler would
            return
        self._compute(req, req.num_computed_tokens, n)

    @precondition(lambda self: self.live and not self.hybrid)
    @rule(data=st.data())
    def fork(self, data):
        parent = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        if parent.num_computed_tokens != parent.num_tokens:
            return  # a child copies finished tokens only
        child = Request(self._new_id(), parent.prompt_token_ids, 8, cache_salt=parent.cache_salt)
        child.output_token_ids = list(parent.output_token_ids)
        child.num_computed_tokens = parent.num_computed_tokens
        self.mgr.fork(parent, child)
        self.live[child.request_id] = child

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data):
        self._free(self.live[data.draw(st.sampled_from(sorted(self.live)))])

    def _free(self, req: Request) -> None:
        self.mgr.free(req)
        del self.live[req.request_id]

    @invariant()
    def every_computed_token_is_readable(self):
        if not hasattr(self, "mgr"):
            return
        for rid, req in self.live.items():
            tokens = req.all_token_ids
            for row, window in self._rows(rid):
                first_live = 0 if window is None else max(0, req.num_computed_tokens - window + 1)
                assert len(row) * BS >= req.num_computed_tokens
                for pos in range(req.num_computed_tokens):
                    block_id = row[pos // BS]
                    if block_id == 0:
                        assert pos < first_live, f"{rid}: token {pos} in the window is gone"
                        continue
                    assert self.shadow[block_id][pos % BS] == tokens[pos], (rid, pos)

    @invariant()
    def nothing_leaks_once_all_are_freed(self):
        if hasattr(self, "mgr") and not self.live:
            assert self.mgr.num_free_blocks == self.mgr.num_usable_blocks


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = FAST
TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = FAST
