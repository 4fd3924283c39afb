"""`append_decode_block` / `cache_decode_block` (the decode fast path's calls) leave the manager
exactly as `allocate_slots(request, 1)` does: rows, hashes, hash map and free-queue order."""

from __future__ import annotations

import struct

import pytest
from kv_helpers import admit, make_manager, make_request

from pagesim.errors import InternalError
from pagesim.scheduler.output import synthetic_token


def _state(mgr) -> tuple:
    pool = mgr.block_pool
    cache = {
        h: (b.block_id if not isinstance(b, dict) else tuple(b))
        for h, b in pool.cached_block_hash_to_block.items()
    }
    return (
        dict(mgr.req_to_block_ids),
        dict(mgr.num_cached_block),
        cache,
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
    )


@pytest.mark.parametrize("lora", [None, "adapter"])
@pytest.mark.parametrize("bs", [4, 16])
def test_decode_events_match_allocate_slots(bs: int, lora: str | None) -> None:
    slow, fast = make_manager(40, bs), make_manager(40, bs)
    prompts = {"a": list(range(3 * bs + 1)), "b": list(range(100, 100 + 2 * bs))}
    pairs = []
    for rid, prompt in prompts.items():
        r_slow = make_request(rid, prompt, max_tokens=6 * bs, lora_name=lora)
        r_fast = make_request(rid, prompt, max_tokens=6 * bs, lora_name=lora)
        admit(slow, r_slow)
        admit(fast, r_fast)
        pairs.append((r_slow, r_fast))
    for _ in range(4 * bs):
        for r_slow, r_fast in pairs:  # one decode each, running order
            c = r_slow.num_computed_tokens
            r_slow.output_token_ids.append(synthetic_token(r_slow, len(r_slow.output_token_ids)))
            assert slow.allocate_slots(r_slow, 1) is not None
            r_slow.num_computed_tokens += 1
            rid = r_fast.request_id
            if c == len(fast.req_to_block_ids[rid]) * bs:
                assert fast.append_decode_block(rid)
            elif (c + 1) % bs == 0 and c + 1 - bs >= len(r_fast.prompt_token_ids):
                first = c + 1 - bs - len(r_fast.prompt_token_ids)
                tokens = [synthetic_token(r_fast, i) for i in range(first, first + bs)]
                fast.cache_decode_block(r_fast, struct.pack(f"<{bs}i", *tokens))
            elif (c + 1) % bs == 0:  # a block holding prompt tokens: the general call
                r_fast.num_computed_tokens = c
                r_fast.output_token_ids[:] = r_slow.output_token_ids
                assert fast.allocate_slots(r_fast, 1) is not None
        assert _state(slow) == _state(fast)
    for r_slow, r_fast in pairs:
        assert r_slow.block_hashes == r_fast.block_hashes


def test_decode_events_refuse_misuse() -> None:
    mgr = make_manager(6, 4)
    r = make_request("a", list(range(8)), max_tokens=20)
    admit(mgr, r)
    with pytest.raises(InternalError, match="not a decode block"):
        mgr.cache_decode_block(r, b"\0" * 16)  # no block after the cached ones
    assert mgr.append_decode_block("a")
    other = make_request("b", list(range(50, 58)), max_tokens=4)
    admit(mgr, other)  # takes the last free blocks
    assert mgr.num_free_blocks == 0
    before = (list(mgr.req_to_block_ids["a"]), mgr.num_free_blocks)
    mgr.num_cached_block["a"] = 3  # as if its row's full blocks were all cached
    assert not mgr.append_decode_block("a")  # no free block: nothing changes
    assert (mgr.req_to_block_ids["a"], mgr.num_free_blocks) == before
    mgr.num_cached_block["a"] = 1  # a full block not cached would be skipped: refused
    with pytest.raises(InternalError, match="not cached"):
        mgr.append_decode_block("a")


@pytest.mark.parametrize("lazy", [False, True])
def test_late_decode_blocks_match_allocate_slots(lazy: bool) -> None:
    """Blocks appended with `late_blocks=True` and cached later in one `cache_decode_blocks`
    call leave the manager as the step-by-step `allocate_slots` calls did."""
    bs = 4
    slow = make_manager(40, bs, lazy_hashing=lazy)
    fast = make_manager(40, bs, lazy_hashing=lazy)
    prompt = list(range(2 * bs + 1))
    r_slow, r_fast = (make_request("a", prompt, max_tokens=6 * bs) for _ in range(2))
    admit(slow, r_slow)
    admit(fast, r_fast)
    for _ in range(4 * bs):
        c = r_slow.num_computed_tokens
        token = synthetic_token(r_slow, len(r_slow.output_token_ids))
        r_slow.output_token_ids.append(token)
        assert slow.allocate_slots(r_slow, 1) is not None
        r_slow.num_computed_tokens += 1
        r_fast.output_token_ids.append(token)
        if c == len(fast.req_to_block_ids["a"]) * bs:
            assert fast.append_decode_block("a", late_blocks=True)
    assert fast.num_cached_block["a"] < slow.num_cached_block["a"]  # really late
    fast.cache_decode_blocks(r_fast, slow.num_cached_block["a"])
    assert _state(slow) == _state(fast)
    assert r_slow.block_hashes == r_fast.block_hashes
    with pytest.raises(InternalError, match="not decode blocks"):
        fast.cache_decode_blocks(r_fast, len(fast.req_to_block_ids["a"]) + 1)
