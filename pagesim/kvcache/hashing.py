"""Chained block hashes: the identity of a full KV block for prefix caching (vLLM's scheme).

    hash(block i) = H(hash(block i-1), token ids of block i, extra keys of block i)
    hash(block -1) = NONE_HASH (a constant derived from a seed)

A block's hash therefore names its tokens *and everything before them*: two requests share
block i only if they agree on all tokens up to its end. Extra keys carry what else changes the
K/V: the LoRA adapter name (every block) and the per-tenant `cache_salt` (first block only; the
chain carries it into every later block, so tenants with different salts never share).

H is BLAKE2b-512 truncated to 16 bytes, over a canonical byte encoding (little-endian int32 token
ids, length-prefixed extra keys), so hashes are the same in every process and on every machine;
Python's `hash()` is never used. Hashing is on the simulator's hot path: `BlockHasher.extend`
packs a request's new tokens once and calls the hash function once per block, and it only ever
hashes blocks past the end of `Request.block_hashes` (never from the start again).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NewType

from pagesim.errors import ConfigError, WorkloadError

if TYPE_CHECKING:
    from pagesim.request import Request

BlockHash = NewType("BlockHash", bytes)
HASH_DIGEST_BYTES = 16

_LORA_TAG = b"\x01"
_SALT_TAG = b"\x02"


def none_hash(seed: int = 0) -> BlockHash:
    """The parent hash of every request's first block, derived from `seed` (vLLM's NONE_HASH)."""
    seed_bytes = seed.to_bytes(8, "little", signed=True)
    return BlockHash(
        hashlib.blake2b(b"pagesim NONE_HASH" + seed_bytes).digest()[:HASH_DIGEST_BYTES]
    )


NONE_HASH: BlockHash = none_hash(0)


def encode_extra_keys(lora_name: str | None = None, cache_salt: str | None = None) -> bytes:
    """Canonical bytes of a block's extra keys: empty when there are none.

    Each key is a tag byte, a little-endian uint32 length and the UTF-8 text, so that
    (lora "a", no salt) and (no lora, salt "a") never collide.
    """
    out = b""
    if lora_name is not None:
        raw = lora_name.encode()
        out += _LORA_TAG + len(raw).to_bytes(4, "little") + raw
    if cache_salt:  # vLLM: an empty salt is no salt (it tests the salt's truth)
        raw = cache_salt.encode()
        out += _SALT_TAG + len(raw).to_bytes(4, "little") + raw
    return out


def hash_block_tokens(
    parent_block_hash: bytes | None, block_token_ids: Sequence[int], extra_keys: bytes = b""
) -> BlockHash:
    """Hash of one block given its parent's hash (None: the first block), tokens and extra keys.

    `extra_keys` is `encode_extra_keys(...)` of this block (the salt only for the first block).
    The reference definition; `BlockHasher.extend` computes the same bytes faster.
    """
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    n = len(block_token_ids)
    payload = _pack_tokens(n, block_token_ids, "block_token_ids")
    data = parent + n.to_bytes(4, "little") + payload + extra_keys
    return BlockHash(hashlib.blake2b(data).digest()[:HASH_DIGEST_BYTES])


def _pack_tokens(n: int, token_ids: Sequence[int], where: str) -> bytes:
    try:
        return struct.pack(f"<{n}i", *token_ids)
    except struct.error:
        bad = next((t for t in token_ids if not -(2**31) <= t < 2**31), None)
        raise WorkloadError(f"{where}: token id {bad!r} is not an int32") from None


class BlockHasher:
    """Extends `Request.block_hashes` for one block size, incrementally.

    `request.block_hashes[i]` is the hash of tokens `[i*block_size, (i+1)*block_size)` of
    prompt + output; only full blocks have a hash.
    """

    def __init__(self, block_size: int) -> None:
        if block_size < 1:
            raise ConfigError(f"block_size={block_size!r}: must be >= 1")
        self.block_size = block_size
        self._count_prefix = block_size.to_bytes(4, "little")  # every hashed block is full
        self._pack_block = struct.Struct(f"<{block_size}i").pack  # one block's token ids
        self._packers: dict[int, Callable[..., bytes]] = {}  # token count -> its packing

    def next_hash(
        self, parent_block_hash: bytes, packed_tokens: bytes, lora_name: str | None = None
    ) -> BlockHash:
        """Hash of a full block after the first, from its parent's hash and its `block_size`
        token ids packed as little-endian int32 (`hash_block_tokens` without the packing)."""
        if lora_name is None:
            return hashlib.blake2b(parent_block_hash + self._count_prefix + packed_tokens).digest()[
                :16
            ]  # type: ignore[return-value]
        data = parent_block_hash + self._count_prefix + packed_tokens
        return BlockHash(
            hashlib.blake2b(data + encode_extra_keys(lora_name, None)).digest()[:HASH_DIGEST_BYTES]
        )

    def extend(self, request: Request, num_blocks: int | None = None) -> None:
        """Hash the request's full blocks that have no hash yet, up to `num_blocks` in total.

        `num_blocks` defaults to every full block of prompt + output; it is clamped to that.
        Never rehashes a block that already has a hash.
        """
        bs = self.block_size
        hashes = request.block_hashes
        start = len(hashes)
        num_full = (len(request.prompt_token_ids) + len(request.output_token_ids)) // bs
        end = num_full if num_blocks is None or num_blocks > num_full else num_blocks
        if start >= end:
            return
        if start + 1 == end and start and request.lora_name is None:
            # One block after the first (a decode filling a block): no extra keys; the same
            # bytes as below, packed with a precompiled format.
            n_prompt = len(request.prompt_token_ids)
            lo = start * bs
            tokens = (
                request.output_token_ids[lo - n_prompt : lo - n_prompt + bs]
                if lo >= n_prompt
                else request.token_ids_slice(lo, lo + bs)
            )
            try:
                data = self._pack_block(*tokens)
            except struct.error:
                data = _pack_tokens(bs, tokens, f"request {request.request_id!r}")
            hashes.append(hashlib.blake2b(hashes[-1] + self._count_prefix + data).digest()[:16])
            return
        tokens = request.token_ids_slice(start * bs, end * bs)
        pack = self._packers.get(len(tokens))
        if pack is None:  # one compiled format per length (at most max_model_len / bs)
            pack = self._packers[len(tokens)] = struct.Struct(f"<{len(tokens)}i").pack
        try:
            data = pack(*tokens)
        except struct.error:
            data = _pack_tokens(len(tokens), tokens, f"request {request.request_id!r}")
        lora, salt = request.lora_name, request.cache_salt
        extra = encode_extra_keys(lora, None) if lora is not None else b""
        blake2b = hashlib.blake2b
        prefix = self._count_prefix
        nbytes = 4 * bs
        parent = hashes[-1] if start else NONE_HASH
        offset = 0
        if start == 0:  # the salt goes into the first block only
            first_extra = encode_extra_keys(lora, salt) if salt else extra
            parent = blake2b(parent + prefix + data[:nbytes] + first_extra).digest()[:16]
            hashes.append(parent)
            offset = nbytes
        append = hashes.append
        if extra:
            for off in range(offset, len(data), nbytes):
                parent = blake2b(parent + prefix + data[off : off + nbytes] + extra).digest()[:16]
                append(parent)
        else:  # the common case, one concatenation less
            for off in range(offset, len(data), nbytes):
                parent = blake2b(parent + prefix + data[off : off + nbytes]).digest()[:16]
                append(parent)
