"""Chained block hashes: canonical bytes, chaining, extra keys, incremental extension."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagesim.errors import ConfigError, WorkloadError
from pagesim.kvcache.hashing import (
    NONE_HASH,
    BlockHasher,
    encode_extra_keys,
    hash_block_tokens,
    none_hash,
)
from pagesim.request import Request

BS = 4


def chain(
    tokens: list[int],
    bs: int,
    lora: str | None = None,
    salt: str | None = None,
    parent: bytes | None = None,
) -> list[bytes]:
    """Reference: hash_block_tokens block by block."""
    out = []
    for i in range(len(tokens) // bs):
        extra = encode_extra_keys(lora, salt if i == 0 else None)
        parent = hash_block_tokens(parent, tokens[i * bs : (i + 1) * bs], extra)
        out.append(parent)
    return out


def test_pinned_values_guard_the_encoding():
    # Changing the byte encoding changes every stored hash: these pins make it deliberate.
    assert NONE_HASH.hex() == "71516b837af513933f88b24edb1b8741"
    assert hash_block_tokens(None, list(range(16))).hex() == "ffc5c6563133614f129efed05694c820"
    assert (
        hash_block_tokens(None, list(range(16)), encode_extra_keys("lora-a", "s1")).hex()
        == "a65f8698cf07e4f7859bac7b2eaca2a0"
    )
    assert len(NONE_HASH) == 16 and none_hash(0) == NONE_HASH and none_hash(1) != NONE_HASH


def test_same_bytes_in_another_process_with_another_hash_seed():
    code = (
        "from pagesim.kvcache.hashing import hash_block_tokens as h;"
        "print(h(h(None, [1, 2, 3]), [4, 5, 6], b'x').hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == hash_block_tokens(hash_block_tokens(None, [1, 2, 3]), [4, 5, 6], b"x").hex()


def test_parent_tokens_and_extra_keys_all_matter():
    base = hash_block_tokens(None, [1, 2, 3, 4])
    assert hash_block_tokens(None, [1, 2, 3, 4]) == base
    assert hash_block_tokens(NONE_HASH, [1, 2, 3, 4]) == base  # None means NONE_HASH
    assert hash_block_tokens(base, [1, 2, 3, 4]) != base
    assert hash_block_tokens(None, [1, 2, 4, 3]) != base
    assert hash_block_tokens(None, [1, 2, 3]) != hash_block_tokens(None, [1, 2, 3, 0])
    keys = {
        encode_extra_keys("a", None),
        encode_extra_keys(None, "a"),
        encode_extra_keys("a", "a"),
        encode_extra_keys("ab", None),
        b"",
    }
    assert len(keys) == 5
    assert len({hash_block_tokens(None, [1, 2, 3, 4], k) for k in keys}) == 5


def test_extend_equals_the_reference_chain_with_salt_and_lora():
    tokens = list(range(100, 123))  # 5 full blocks + 3 tokens
    for lora, salt in [(None, None), (None, "tenant"), ("lora-x", None), ("lora-x", "tenant")]:
        req = Request("r", tokens, 8, cache_salt=salt, lora_name=lora)
        BlockHasher(BS).extend(req)
        assert req.block_hashes == chain(tokens, BS, lora, salt)
    salted = Request("a", tokens, 8, cache_salt="s1")
    plain = Request("b", tokens, 8)
    hasher = BlockHasher(BS)
    hasher.extend(salted)
    hasher.extend(plain)
    # The salt is in the first block only, but the chain carries it into every block.
    assert all(x != y for x, y in zip(salted.block_hashes, plain.block_hashes, strict=True))


def test_extend_is_incremental_over_prompt_and_output():
    hasher = BlockHasher(BS)
    req = Request("r", [1, 2, 3, 4, 5, 6], 16)
    hasher.extend(req)
    assert len(req.block_hashes) == 1  # the partial second block has no hash
    sentinel = b"S" * 16
    req.block_hashes[0] = sentinel  # never rehashed from the start: the sentinel survives
    req.output_token_ids.extend([7, 8, 9])  # block 1 = prompt[4:6] + output[0:2]
    hasher.extend(req)
    assert req.block_hashes[0] == sentinel
    assert req.block_hashes[1] == hash_block_tokens(sentinel, [5, 6, 7, 8])
    req.block_hashes[:] = chain(req.all_token_ids, BS)  # undo the sentinel's chain
    req.output_token_ids.extend(range(10, 20))
    hasher.extend(req, num_blocks=3)  # an explicit limit
    assert len(req.block_hashes) == 3
    hasher.extend(req)
    assert req.block_hashes == chain(req.all_token_ids, BS)


def test_extending_in_pieces_equals_extending_at_once():
    tokens = list(range(50))
    once = Request("a", tokens, 1)
    BlockHasher(BS).extend(once)
    pieces = Request("b", tokens[:9], 1)
    hasher = BlockHasher(BS)
    hasher.extend(pieces)
    for t in tokens[9:]:
        pieces.output_token_ids.append(t)
        hasher.extend(pieces)
    assert pieces.block_hashes == once.block_hashes


def test_bad_input():
    with pytest.raises(ConfigError, match="block_size=0"):
        BlockHasher(0)
    with pytest.raises(WorkloadError, match="token id 4294967296 is not an int32"):
        BlockHasher(2).extend(Request("r", [1, 2**32], 1))
    with pytest.raises(WorkloadError, match="block_token_ids"):
        hash_block_tokens(None, [-(2**31) - 1])


def test_an_empty_salt_is_no_salt_as_in_vllm():
    """vLLM adds the salt to the first block's extra keys only when it is truthy, so a request
    with cache_salt="" shares its blocks with unsalted requests of the same prompt."""
    tokens = list(range(100, 123))
    empty, plain, lora_empty = (
        Request("e", tokens, 8, cache_salt=""),
        Request("p", tokens, 8),
        Request("l", tokens, 8, cache_salt="", lora_name="x"),
    )
    hasher = BlockHasher(BS)
    for req in (empty, plain, lora_empty):
        hasher.extend(req)
    assert empty.block_hashes == plain.block_hashes == chain(tokens, BS, None, None)
    assert lora_empty.block_hashes == chain(tokens, BS, "x", None)
    assert encode_extra_keys(None, "") == b""
