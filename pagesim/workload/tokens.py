"""Deterministic prompt token synthesis.

Traces give lengths and sharing, never text, so prompt tokens are synthesized. Every prompt is
a concatenation of *segments*, each the first `length` tokens of a *root stream*:

    prompt = [root r0: tokens 0..l0) [root r1: tokens 0..l1) ...

A root is one unit of content identity: a shared system prompt, one request's own user
tokens, or one Mooncake hash block. Two segments of the same root start with the same tokens,
so equal roots share exactly their common prefix.

Token `p` of root `r` (vocabulary size `V`; `table` holds TABLE_SIZE tokens drawn uniformly
from the plan's seeded `numpy.random.Generator`):

    p == 0:  r % V          (lead tokens: the root id in base V,
    p == 1:  (r // V) % V    so distinct roots differ within their first two tokens)
    p >= 2:  table[(offset(r) + p) % TABLE_SIZE],   offset(r) = mix64(key ^ r) % TABLE_SIZE

The lead tokens make first-block collisions impossible rather than unlikely: two distinct
roots never share a first KV block of two or more tokens (nor of one token when there are
fewer than V roots), so a prompt hits the prefix cache only where the workload says it shares;
after a differing first block, chained block hashes never meet again whatever the tokens.
This needs fewer than V**2 roots in a plan (1.02e9 for V = 32000); the plan checks.

Why windows of one seeded table rather than a Generator per root: a prompt is then a few array
slices (the cost is the final `.tolist()`), any 512-token block can be produced alone, and a
Mooncake prompt of ~24 hash blocks costs no per-block Generator setup (~25 us each).
"""

from __future__ import annotations

import numpy as np

MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake `hash_ids` block (FAST'25 release README)
LEAD_TOKENS = 2  # leading tokens of every root that spell its id in base vocab_size
TABLE_SIZE = 1 << 16  # tokens in a plan's table; its windows give the roots' content

_MASK64 = (1 << 64) - 1
_ROOT_MUL = 0xD1B54A32D192ED03


def _mix64(x: int) -> int:
    """SplitMix64 finalizer on a Python int (64-bit wrapping)."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def root_offset(key: int, root: int) -> int:
    """Where root `root`'s window starts in the table: [0, TABLE_SIZE)."""
    return _mix64(key ^ ((root * _ROOT_MUL) & _MASK64)) % TABLE_SIZE


def content_key(seed: int) -> int:
    """64-bit key that places each root's window in the table; a function of the seed only."""
    state = np.random.SeedSequence([int(seed), 0x70A6E5]).generate_state(1, dtype=np.uint64)
    return int(state[0])


def token_table(seed: int, vocab_size: int) -> np.ndarray:
    """int64 [2 * TABLE_SIZE]: TABLE_SIZE seeded uniform tokens, stored twice so that any
    window of up to TABLE_SIZE tokens is one slice."""
    t = np.random.default_rng([int(seed), 0x70CE45]).integers(0, vocab_size, size=TABLE_SIZE)
    return np.concatenate([t, t]).astype(np.int64)


def max_roots(vocab_size: int) -> int:
    """How many distinct roots the two lead tokens can tell apart."""
    return vocab_size**LEAD_TOKENS


def segment_tokens(
    table: np.ndarray, key: int, segments: list[tuple[int, int]], vocab_size: int
) -> np.ndarray:
    """Concatenate, for each (root, length) in `segments`, the root's first `length` tokens.

    Returns int64 [sum of lengths]. Plain Python over the few segments of a prompt (at most
    one per 512 tokens), numpy slices for the tokens.
    """
    parts = []
    for root, n in segments:
        if n <= 0:
            continue
        off = root_offset(key, root)
        if n <= TABLE_SIZE:
            seg = table[off : off + n].copy()
        else:
            seg = table.take(np.arange(off, off + n), mode="wrap")
        seg[0] = root % vocab_size
        if n > 1:
            seg[1] = (root // vocab_size) % vocab_size
        parts.append(seg)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def segment_token_list(
    table: list[int], key: int, segments: list[tuple[int, int]], vocab_size: int
) -> list[int]:
    """`segment_tokens(...).tolist()` from `table` as a list (`token_table(...).tolist()`):
    list slices share the table's int objects, with no numpy call per prompt."""
    out: list[int] = []
    for root, n in segments:
        if n <= 0:
            continue
        off = root_offset(key, root)
        if n <= TABLE_SIZE:
            seg = table[off : off + n]
        else:  # longer than the table: the windows wrap around (as `take(mode="wrap")`)
            size = len(table)
            seg = [table[(off + p) % size] for p in range(n)]
        seg[0] = root % vocab_size
        if n > 1:
            seg[1] = (root // vocab_size) % vocab_size
        if out:
            out += seg
        else:
            out = seg
    return out


def block_segments(block_roots: list[int], num_tokens: int) -> list[tuple[int, int]]:
    """(root, length) segments for `num_tokens` tokens made of 512-token hash blocks.

    Every block is full except the last, which takes a prefix of its root's 512 tokens, so
    equal hash ids give equal tokens and any block size dividing 512 shares exactly the
    blocks the trace shares.
    """
    segs = [(r, MOONCAKE_BLOCK_TOKENS) for r in block_roots]
    if segs:
        segs[-1] = (block_roots[-1], num_tokens - MOONCAKE_BLOCK_TOKENS * (len(segs) - 1))
    return segs
