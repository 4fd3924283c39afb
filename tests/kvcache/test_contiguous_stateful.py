"""Random admit / grow / free / preempt sequences on the contiguous managers, with the
invariant checker on after every call and a reference model of who holds which units."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.request import Request

MAX_MODEL_LEN = 64


class ContiguousMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mgr: ContiguousKVCacheManager | None = None
        self.live: dict[str, Request] = {}
        self.next_id = 0

    @initialize(
        policy=st.sampled_from(["reserve-max", "pow2", "oracle"]),
        placement=st.sampled_from(["buddy", "first-fit"]),
        block_size=st.sampled_from([1, 4, 16]),
        num_units=st.integers(4, 70),
    )
    def build(self, policy, placement, block_size, num_units):
        # at least one max_model_len region fits, as sizing guarantees for real configs
        need = -(-MAX_MODEL_LEN // block_size)
        if placement == "buddy":
            need = 1 << (need - 1).bit_length()
        self.mgr = ContiguousKVCacheManager(
            max(num_units, need) + 1,
            block_size,
            policy,
            placement,
            max_model_len=MAX_MODEL_LEN,
            check_invariants=True,
        )

    @rule(prompt=st.integers(1, 40), data=st.data())
    def admit(self, prompt, data):
        mgr = self.mgr
        max_tokens = data.draw(st.integers(1, MAX_MODEL_LEN - prompt))
        rid = f"r{self.next_id}"
        self.next_id += 1
        req = Request(rid, list(range(prompt)), max_tokens=max_tokens)
        chunk = data.draw(st.integers(1, prompt))
        free_before = mgr.num_free_blocks
        fits = self._fits(mgr.region_units(req.max_num_tokens))
        got = mgr.allocate_slots(req, chunk)
        assert (got is not None) == fits
        if got is None:
            assert mgr.num_free_blocks == free_before and rid not in mgr.reservations
            return
        req.num_computed_tokens = chunk
        self.live[rid] = req
        res = mgr.reservations[rid]
        assert res.region.size * mgr.block_size >= min(self._policy_tokens(req), MAX_MODEL_LEN)
        assert len(res.row) == -(-chunk // mgr.block_size)

    def _fits(self, units: int) -> bool:
        return any(r.size >= units for r in self.mgr.allocator.free_regions())

    def _policy_tokens(self, req: Request) -> int:
        final = req.max_num_tokens
        return {
            "reserve-max": MAX_MODEL_LEN,
            "oracle": final,
            "pow2": 1 << (final - 1).bit_length(),
        }[self.mgr.policy]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def grow(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live[rid]
        room = req.max_num_tokens - 1 - req.num_computed_tokens  # K/V still to come
        if room < 1:
            return
        n = data.draw(st.integers(1, room))
        assert self.mgr.allocate_slots(req, n) is not None  # inside its region: never fails
        req.num_computed_tokens += n
        row = self.mgr.get_block_ids(rid)
        assert len(row) * self.mgr.block_size >= req.num_computed_tokens

    @precondition(lambda self: self.live)
    @rule(data=st.data(), preempt=st.booleans())
    def free(self, data, preempt):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        req = self.live.pop(rid)
        self.mgr.free(req)
        assert self.mgr.get_block_ids(rid) == []
        if preempt:  # recompute: comes back later as a fresh admission of the same request
            req.num_computed_tokens = 0
            req.num_preemptions += 1
            if self.mgr.allocate_slots(req, 1) is not None:
                req.num_computed_tokens = 1
                self.live[rid] = req

    @invariant()
    def holders_disjoint_and_accounted(self):
        mgr = self.mgr
        if mgr is None:
            return
        owned: set[int] = set()
        for rid, res in mgr.reservations.items():
            units = set(range(res.region.start, res.region.end))
            assert not units & owned, f"{rid} overlaps another region"
            owned |= units
        assert len(owned) + mgr.num_free_blocks == mgr.num_usable_blocks
        assert set(mgr.reservations) == set(self.live)

    def teardown(self):
        if self.mgr is None:
            return
        for req in list(self.live.values()):
            self.mgr.free(req)
        self.mgr.check_invariants()  # no reservation left: the line must be whole again
        assert self.mgr.num_free_blocks == self.mgr.num_usable_blocks


TestContiguousStateful = ContiguousMachine.TestCase
TestContiguousStateful.settings = settings(
    max_examples=50,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
