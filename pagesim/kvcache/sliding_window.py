"""Sliding-window attention bookkeeping (vLLM's `SlidingWindowManager`).

With a window of W tokens, the query at position p attends to positions p - W + 1 .. p. Once
`num_computed_tokens` tokens are in the cache, the next query sits at that position, so every
token before `num_computed_tokens - W + 1` is dead; a block all of whose tokens are dead is freed
and its table entry becomes the null block (id 0), which keeps logical indices in place:

    W = 8, block_size = 4, num_computed_tokens = 14  ->  tokens 0..6 dead, block 0 dead
    table [b3, b7, b9, b2]  ->  [null, b7, b9, b2]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pagesim.errors import ConfigError
from pagesim.kvcache.block import KVCacheBlock
from pagesim.kvcache.block_pool import BlockPool

_Hit = TypeVar("_Hit")  # what one lookup finds: a block, or a block per group


class SlidingWindow:
    """Window arithmetic and the two window-specific operations (lookup, freeing)."""

    def __init__(
        self,
        sliding_window: int,
        block_size: int,
        max_num_batched_tokens: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        if not isinstance(sliding_window, int) or sliding_window < 1:
            raise ConfigError(f"sliding_window={sliding_window!r}: must be an int >= 1")
        if max_num_batched_tokens is not None and max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens={max_num_batched_tokens!r}: must be >= 1")
        self.sliding_window = sliding_window
        self.block_size = block_size
        # A prefix hit needs this many contiguous cached blocks before the next query
        # (-1: the query token itself is inside the window).
        self.contiguous_blocks = -(-(sliding_window - 1) // block_size)
        # vLLM's recycling-aware admission cap: a request holds at most one window plus one
        # batch of new tokens (and a block of misalignment) at a time.
        self.admission_cap_blocks: int | None = None
        if max_num_batched_tokens is not None:
            tokens = sliding_window - 1 + max_num_batched_tokens
            if max_model_len is not None:
                tokens = min(tokens, max_model_len)
            self.admission_cap_blocks = -(-tokens // block_size) + 1
        # Most live blocks while decoding one token at a time (the table length minus the
        # freed prefix, maximised over where the window boundary falls in a block).
        self.peak_decode_blocks = max(
            -(-t // block_size) - max(0, t - sliding_window) // block_size
            for t in range(1, sliding_window + block_size + 1)
        )

    @property
    def peak_blocks(self) -> int:
        """Most live blocks one request holds: decoding, or prefilling in capped chunks."""
        cap = self.admission_cap_blocks
        return self.peak_decode_blocks if cap is None else max(cap, self.peak_decode_blocks)

    def live_blocks(self, num_blocks: int, num_computed_tokens: int, admission: bool) -> int:
        """Non-null blocks of a table of `num_blocks` entries once the dead ones are nulled;
        with `admission`, the admission cap instead (vLLM's full-sequence gate)."""
        if admission:
            return self.cap_admission_blocks(num_blocks)
        return num_blocks - min(self.num_skipped_blocks(num_computed_tokens), num_blocks)

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Whole blocks before the window of the next query."""
        skipped_tokens = num_computed_tokens - self.sliding_window + 1
        return skipped_tokens // self.block_size if skipped_tokens > 0 else 0

    def cap_admission_blocks(self, num_blocks: int) -> int:
        cap = self.admission_cap_blocks
        return num_blocks if cap is None or num_blocks <= cap else cap

    def find_longest_cache_hit(
        self,
        lookup: Callable[[bytes], _Hit | None],
        null: _Hit,
        block_hashes: Sequence[bytes],
        max_num_blocks: int,
    ) -> list[_Hit]:
        """The hit as a table prefix: `null` where the window needs nothing, then what `lookup`
        finds cached (a block, or one per group of a hybrid model; None on a miss). Searches
        right to left for `contiguous_blocks` hits in a row; with none, falls back to the hits
        at the very start."""
        computed: list[_Hit] = [null] * max_num_blocks
        num_contiguous = 0
        for i in range(max_num_blocks - 1, -1, -1):
            found = lookup(block_hashes[i])
            if found is None:
                num_contiguous = 0
                continue
            computed[i] = found
            num_contiguous += 1
            if num_contiguous >= self.contiguous_blocks:
                del computed[i + num_contiguous :]  # [NULL, NULL, 8, 3, NULL, 9] -> [.., 8, 3]
                return computed
        del computed[num_contiguous:]
        return computed

    def remove_skipped_blocks(
        self, pool: BlockPool, row: list[KVCacheBlock], row_ids: list[int], num_computed_tokens: int
    ) -> int:
        """Free the dead blocks of a table row (latest first) and null them. Returns how many.

        Walks back from the last dead block and stops at the first null one: everything before
        it was freed by an earlier call.
        """
        num_skipped = min(self.num_skipped_blocks(num_computed_tokens), len(row))
        null = pool.null_block
        removed: list[KVCacheBlock] = []
        for i in range(num_skipped - 1, -1, -1):
            block = row[i]
            if block is null:
                break
            removed.append(block)
            row[i] = null
            row_ids[i] = null.block_id
        if removed:
            pool.free_blocks(removed)
        return len(removed)
