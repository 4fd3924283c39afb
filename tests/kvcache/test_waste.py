"""The KV waste split on hand-computed states, for contiguous and paged managers."""

from __future__ import annotations

import pytest

from pagesim.errors import ConfigError
from pagesim.kvcache.contiguous import ContiguousKVCacheManager
from pagesim.kvcache.kv_cache_manager import KVCacheManager
from pagesim.kvcache.waste import KVSlots, KVWaste, WasteAverager, kv_slots, kv_waste
from pagesim.request import Request


def _req(rid: str, prompt: list[int] | int, max_tokens: int) -> Request:
    tokens = list(range(prompt)) if isinstance(prompt, int) else prompt
    return Request(rid, tokens, max_tokens=max_tokens)


def _admit(mgr, req: Request, n: int) -> None:
    assert mgr.allocate_slots(req, n) is not None
    req.num_computed_tokens = n


def test_contiguous_oracle_first_fit_by_hand():
    m = ContiguousKVCacheManager(21, 1, "oracle", "first-fit", max_model_len=20)
    a = _req("a", 5, 3)  # region 8 slots, final K/V 7
    b = _req("b", 4, 4)  # region 8 slots, final K/V 7
    _admit(m, a, 5)
    _admit(m, b, 4)
    b.output_token_ids += [1, 2]
    assert m.allocate_slots(b, 2) is not None
    b.num_computed_tokens = 6
    # a: 5 held, 2 to come, 1 never (slot of the last sampled token); b: 6, 1, 1
    assert kv_slots(m) == KVSlots(
        total=20,
        token_states=11,
        reserved=3,
        internal_fragmentation=2,
        external_fragmentation=0,
        free=4,
    )
    c = _req("c", 3, 3)  # needs 6 contiguous slots; the only hole has 4
    assert kv_slots(m, next_request=c) == KVSlots(20, 11, 3, 2, 4, 0)
    small = _req("d", 1, 1)  # 2 slots: the hole of 4 serves two of them
    assert kv_slots(m, next_request=small) == KVSlots(20, 11, 3, 2, 0, 4)
    three = _req("e", 2, 1)  # 3 slots: one fits in the hole of 4, 1 slot is left over
    assert kv_slots(m, next_request=three).external_fragmentation == 1
    w = kv_waste(m, next_request=c)
    assert w == KVWaste(0.55, 0.15, 0.10, 0.20, 0.0)


def test_contiguous_reserve_max_buddy_by_hand():
    m = ContiguousKVCacheManager(17, 4, "reserve-max", "buddy", max_model_len=32)  # 16 blocks
    a = _req("a", 10, 6)  # region 32 slots (8 blocks), final K/V 15
    _admit(m, a, 10)
    s = kv_slots(m)
    assert s == KVSlots(
        total=64,
        token_states=10,
        reserved=5,
        internal_fragmentation=17,
        external_fragmentation=0,
        free=32,
    )
    b = _req("b", 10, 6)
    _admit(m, b, 3)
    m.free(a)  # free: [0, 8) blocks, used [8, 16)
    assert kv_slots(m, next_request=a) == KVSlots(64, 3, 12, 17, 0, 32)


def test_buddy_external_fragmentation():
    m = ContiguousKVCacheManager(17, 1, "oracle", "buddy", max_model_len=16)  # 16 slots
    reqs = [_req(f"r{i}", 3, 1) for i in range(4)]  # 4 slots each -> [0,4) [4,8) [8,12) [12,16)
    for r in reqs:
        _admit(m, r, 3)
    m.free(reqs[0])
    m.free(reqs[2])  # two free buddies of 4 that cannot merge: 8 slots free
    big = _req("big", 6, 2)  # 8 slots: no free block of 8
    s = kv_slots(m, next_request=big)
    assert (s.external_fragmentation, s.free) == (8, 0)
    assert kv_slots(m, next_request=reqs[0]).external_fragmentation == 0


def test_paged_by_hand_with_prefix_sharing():
    m = KVCacheManager(num_gpu_blocks=11, block_size=4)  # 10 usable blocks = 40 slots
    a = _req("a", list(range(100, 110)), 5)  # 10 tokens: 3 blocks, final K/V 14
    b = _req("b", list(range(200, 206)), 1)  # 6 tokens: 2 blocks, final K/V 6
    _admit(m, a, 10)
    _admit(m, b, 6)
    # a: 12 slots, 10 held, 2 to come; b: 8 slots, 6 held, 2 never filled
    assert kv_slots(m, [a, b]) == KVSlots(
        total=40,
        token_states=16,
        reserved=2,
        internal_fragmentation=2,
        external_fragmentation=0,
        free=20,
    )
    c = _req("c", list(range(100, 110)), 5)  # same prompt as a: 2 full blocks hit
    hit, n_hit = m.get_computed_blocks(c)
    assert n_hit == 8
    assert m.allocate_slots(c, 2, n_hit, hit) is not None
    c.num_computed_tokens = 10
    # one new block: 6 used blocks; the 2 shared blocks hold 8 K/V slots counted once
    assert kv_slots(m, [a, b, c]) == KVSlots(40, 18, 4, 2, 0, 16)
    m.free(b)
    assert kv_slots(m, [a, c]) == KVSlots(40, 12, 4, 0, 0, 24)
    with pytest.raises(ConfigError, match="running=None"):
        kv_slots(m)


def test_fractions_sum_to_one_under_the_scheduler():
    from pagesim.config import EngineConfig
    from pagesim.scheduler.output import ModelRunnerOutput
    from pagesim.sim.build import build_scheduler

    for allocator in ("paged", "reserve-max", "pow2", "oracle"):
        cfg = EngineConfig.create(
            model="tiny-llama",
            gpu="a10g",
            num_gpu_blocks_override=30,
            max_model_len=256,
            max_num_seqs=8,
            max_num_batched_tokens=128,
            allocator=allocator,
        )
        s = build_scheduler(cfg)
        for i in range(10):
            s.add_request(_req(f"r{i}", [i * 1000 + j for j in range(30 + 11 * i)], 4 + 3 * i))
        avg = WasteAverager()
        steps = 0
        while s.has_unfinished_requests() and steps < 400:
            out = s.schedule()
            head = s.waiting.peek_request() if s.waiting else None
            slots = kv_slots(s.kv_cache_manager, s.running, head)
            parts = (
                slots.token_states,
                slots.reserved,
                slots.internal_fragmentation,
                slots.external_fragmentation,
                slots.free,
            )
            assert min(parts) >= 0 and sum(parts) == slots.total, (allocator, slots)
            assert slots.token_states <= sum(r.num_computed_tokens for r in s.running)
            avg.add(slots, 0.01)
            sampled = {
                sr.request_id: 1
                for sr in out.scheduled
                if sr.num_computed_tokens + sr.num_new_tokens >= sr.request.num_tokens
            }
            s.update_from_output(out, ModelRunnerOutput(0.01, sampled))
            steps += 1
        assert not s.has_unfinished_requests()
        mean = avg.mean()
        assert sum(mean) == pytest.approx(1.0)
        assert 0 < avg.max_used <= 1.0
        if allocator == "paged":
            assert mean.external_fragmentation == 0.0


def test_averager():
    avg = WasteAverager()
    assert avg.mean() is None
    avg.add(KVWaste(0.5, 0.1, 0.1, 0.1, 0.2), 1.0)
    avg.add(KVSlots(10, 1, 1, 1, 1, 6), 3.0)
    m = avg.mean()
    assert m == pytest.approx(KVWaste(0.2, 0.1, 0.1, 0.1, 0.5))
    assert avg.duration_s == 4.0 and avg.max_used == pytest.approx(0.7)
    avg.add(KVWaste(1, 0, 0, 0, 0), 0.0)  # zero-length states change nothing but the peak
    assert avg.mean() == pytest.approx(m) and avg.max_used == 1.0
    with pytest.raises(ConfigError, match="duration_s=-1"):
        avg.add(m, -1)
