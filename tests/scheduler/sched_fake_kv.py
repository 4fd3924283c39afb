"""A small stand-in for the KV cache manager contract, with vLLM 0.33's observable behaviour.

Used to test the scheduler apart from the real manager: block 0 is the null block, free blocks
are handed out from the head, a request's blocks are freed tail first (hashed ones to the tail,
unhashed ones to the head), full blocks are cached when allocated, a prefix hit is capped at
num_tokens - 1 and floored to whole blocks, and a failed allocation changes nothing.
"""

from __future__ import annotations

from collections import OrderedDict


class FakeKVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int = 16, enable_caching: bool = True,
                 max_model_len: int = 1 << 30) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_gpu_blocks))
        self.ref_cnt = [0] * num_gpu_blocks
        self.block_hash: list[tuple | None] = [None] * num_gpu_blocks
        self.cached: dict[tuple, int] = {}
        self.req_blocks: dict[str, list[int]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.calls: list[tuple] = []  # (method, request_id, args) for assertions

    # ---- hashing: a chain of token tuples (the salt goes into the first block) ----
    def _hashes(self, req, num_blocks: int) -> list[tuple]:
        bs, out, parent = self.block_size, [], ("salt", req.cache_salt)
        for i in range(num_blocks):
            parent = (parent, tuple(req.token_ids_slice(i * bs, (i + 1) * bs)))
            out.append(parent)
        return out

    def can_fit(self, num_tokens: int) -> bool:
        return -(-num_tokens // self.block_size) <= self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / (self.num_gpu_blocks - 1)

    def get_computed_blocks(self, req):
        if not self.enable_caching:
            return [], 0
        max_blocks = (req.num_tokens - 1) // self.block_size
        hit: list[int] = []
        for h in self._hashes(req, max_blocks):
            block = self.cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit, len(hit) * self.block_size

    def allocate_slots(self, req, num_new_tokens, num_new_computed_tokens=0,
                       new_computed_blocks=None, num_lookahead_tokens=0,
                       full_sequence_must_fit=False):
        self.calls.append(("allocate_slots", req.request_id, num_new_tokens))
        bs = self.block_size
        held = self.req_blocks.get(req.request_id, [])
        hits = list(new_computed_blocks or [])
        evictable = sum(1 for b in hits if self.ref_cnt[b] == 0)
        computed = req.num_computed_tokens + num_new_computed_tokens
        if full_sequence_must_fit:
            full = min(req.num_tokens, self.max_model_len)
            if -(-full // bs) - len(held) - len(hits) + evictable > len(self.free_queue):
                return None
        need = -(-(computed + num_new_tokens + num_lookahead_tokens) // bs) - len(held) - len(hits)
        if need + evictable > len(self.free_queue):
            return None
        blocks = self.req_blocks.setdefault(req.request_id, [])
        for b in hits:
            if self.ref_cnt[b] == 0:
                del self.free_queue[b]
            self.ref_cnt[b] += 1
            blocks.append(b)
        new = []
        for _ in range(max(need, 0)):
            b, _ = self.free_queue.popitem(last=False)
            if self.block_hash[b] is not None:
                self.cached.pop(self.block_hash[b], None)
                self.block_hash[b] = None
            self.ref_cnt[b] = 1
            new.append(b)
        blocks.extend(new)
        if self.enable_caching:
            num_full = min(computed + num_new_tokens, req.num_tokens) // bs
            start = self.num_cached_blocks.get(req.request_id, 0)
            hashes = self._hashes(req, num_full)
            for i in range(start, num_full):
                if self.block_hash[blocks[i]] is None:
                    self.block_hash[blocks[i]] = hashes[i]
                    self.cached.setdefault(hashes[i], blocks[i])
            self.num_cached_blocks[req.request_id] = max(start, num_full)
        return new

    def get_block_ids(self, request_id):
        return self.req_blocks.get(request_id, [])

    def free(self, req):
        self.calls.append(("free", req.request_id, None))
        blocks = self.req_blocks.pop(req.request_id, [])
        self.num_cached_blocks.pop(req.request_id, None)
        for b in reversed(blocks):
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue[b] = None
                if self.block_hash[b] is None:
                    self.free_queue.move_to_end(b, last=False)

    def take_blocks_to_copy(self):
        return []
