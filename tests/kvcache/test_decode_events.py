"""`append_decode_blocks` / `cache_decode_block` (the calls of bulk decodes) leave the manager
exactly as `allocate_slots(request, 1)` does: rows, hashes, hash map and free-queue order."""

from __future__ import annotations

import struct

import pytest
from kv_helpers import admit, make_manager, make_request

from pagesim.errors import InternalError
from pagesim.scheduler.output import synthetic_token
from pagesim.sim.deferred_hashes import DeferredHashTable


def _state(mgr) -> tuple:
    pool = mgr.block_pool
    if mgr.deferred_hashes is not None:
        mgr.deferred_hashes.materialize_all()
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
    slow, bulk = make_manager(40, bs), make_manager(40, bs)
    prompts = {"a": list(range(3 * bs + 1)), "b": list(range(100, 100 + 2 * bs))}
    pairs = []
    for rid, prompt in prompts.items():
        r_slow = make_request(rid, prompt, max_tokens=6 * bs, lora_name=lora)
        r_bulk = make_request(rid, prompt, max_tokens=6 * bs, lora_name=lora)
        admit(slow, r_slow)
        admit(bulk, r_bulk)
        pairs.append((r_slow, r_bulk))
    appends: list[str] = []  # consecutive appends go in one call, as bulk decodes make them

    def flush() -> None:
        if appends:
            assert bulk.append_decode_blocks(appends)
            appends.clear()

    for _ in range(4 * bs):
        for r_slow, r_bulk in pairs:  # one decode each, running order
            c = r_slow.num_computed_tokens
            r_slow.output_token_ids.append(synthetic_token(r_slow, len(r_slow.output_token_ids)))
            assert slow.allocate_slots(r_slow, 1) is not None
            r_slow.num_computed_tokens += 1
            rid = r_bulk.request_id
            if c == len(bulk.req_to_block_ids[rid]) * bs:
                appends.append(rid)
            elif (c + 1) % bs == 0 and c + 1 - bs >= len(r_bulk.prompt_token_ids):
                first = c + 1 - bs - len(r_bulk.prompt_token_ids)
                tokens = [synthetic_token(r_bulk, i) for i in range(first, first + bs)]
                flush()
                bulk.cache_decode_block(r_bulk, struct.pack(f"<{bs}i", *tokens))
            elif (c + 1) % bs == 0:  # a block holding prompt tokens: the general call
                r_bulk.num_computed_tokens = c
                r_bulk.output_token_ids[:] = r_slow.output_token_ids
                flush()
                assert bulk.allocate_slots(r_bulk, 1) is not None
        flush()
        assert _state(slow) == _state(bulk)
    for r_slow, r_bulk in pairs:
        assert r_slow.block_hashes == r_bulk.block_hashes


def test_decode_events_refuse_misuse() -> None:
    mgr = make_manager(6, 4)
    r = make_request("a", list(range(8)), max_tokens=20)
    admit(mgr, r)
    with pytest.raises(InternalError, match="not a decode block"):
        mgr.cache_decode_block(r, b"\0" * 16)  # no block after the cached ones
    assert mgr.append_decode_blocks(["a"])
    other = make_request("b", list(range(50, 58)), max_tokens=4)
    admit(mgr, other)  # takes the last free blocks
    assert mgr.num_free_blocks == 0
    before = (list(mgr.req_to_block_ids["a"]), mgr.num_free_blocks)
    mgr.num_cached_block["a"] = 3  # as if its row's full blocks were all cached
    assert not mgr.append_decode_blocks(["a"])  # no free block: nothing changes
    assert (mgr.req_to_block_ids["a"], mgr.num_free_blocks) == before


@pytest.mark.parametrize("deferred", [None, DeferredHashTable])
def test_decode_blocks_cached_later_match_allocate_slots(deferred) -> None:
    """Blocks appended while the row's full blocks are not cached, cached later in one
    `cache_decode_blocks` call, leave the manager as the step-by-step `allocate_slots` calls
    did."""
    bs = 4
    slow = make_manager(40, bs, deferred_hashes=deferred)
    bulk = make_manager(40, bs, deferred_hashes=deferred)
    prompt = list(range(2 * bs + 1))
    r_slow, r_bulk = (make_request("a", prompt, max_tokens=6 * bs) for _ in range(2))
    admit(slow, r_slow)
    admit(bulk, r_bulk)
    for _ in range(4 * bs):
        c = r_slow.num_computed_tokens
        token = synthetic_token(r_slow, len(r_slow.output_token_ids))
        r_slow.output_token_ids.append(token)
        assert slow.allocate_slots(r_slow, 1) is not None
        r_slow.num_computed_tokens += 1
        r_bulk.output_token_ids.append(token)
        if c == len(bulk.req_to_block_ids["a"]) * bs:
            assert bulk.append_decode_blocks(["a"])
    assert bulk.num_cached_block["a"] < slow.num_cached_block["a"]  # really cached later
    bulk.cache_decode_blocks(r_bulk, slow.num_cached_block["a"])
    assert _state(slow) == _state(bulk)
    assert r_slow.block_hashes == r_bulk.block_hashes
    with pytest.raises(InternalError, match="not decode blocks"):
        bulk.cache_decode_blocks(r_bulk, len(bulk.req_to_block_ids["a"]) + 1)
