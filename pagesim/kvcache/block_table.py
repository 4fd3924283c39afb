"""Block tables and slot mappings: how the GPU finds a token's K/V.

One implementation, used by the GPU runner as it is and checked by CPU tests, so that the
simulator and the kernels agree on where every token lives.

    block_table[seq] = [b0, b1, b2, ...]        (logical block j of seq -> physical block id)
    token at position p of seq lives in block  block_table[seq][p // block_size]
                               at offset       p %  block_size
    slot = block_id * block_size + offset      (index into the flattened cache
                                                [num_blocks * block_size, num_kv_heads, head_size])

Padding: rows of the block table are padded with the null block (id 0, never handed out), so a
kernel that reads past a sequence's end reads valid memory; padded slots are `PAD_SLOT_ID`
(negative), which `reshape_and_cache` skips.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0


def build_block_table(
    block_ids_per_seq: Sequence[Sequence[int]],
    max_num_blocks_per_seq: int | None = None,
    pad_block_id: int = NULL_BLOCK_ID,
) -> list[list[int]]:
    """Rows of physical block ids, padded to one width.

    Returns `[num_seqs][max_num_blocks_per_seq]`; the width defaults to the longest row.
    """
    width = max((len(r) for r in block_ids_per_seq), default=0)
    if max_num_blocks_per_seq is not None:
        if max_num_blocks_per_seq < width:
            raise ValueError(
                f"max_num_blocks_per_seq={max_num_blocks_per_seq} < longest row ({width})"
            )
        width = max_num_blocks_per_seq
    return [list(r) + [pad_block_id] * (width - len(r)) for r in block_ids_per_seq]


def build_slot_mapping(
    block_ids_per_seq: Sequence[Sequence[int]],
    start_positions: Sequence[int],
    num_new_tokens: Sequence[int],
    block_size: int,
    pad_to: int | None = None,
) -> list[int]:
    """Slots for the new tokens of each sequence, concatenated in sequence order.

    Sequence i writes tokens at positions `start_positions[i] .. start_positions[i] +
    num_new_tokens[i] - 1`. With `pad_to`, the list is padded with `PAD_SLOT_ID` to that
    length (CUDA-graph batches are padded to a captured size).
    """
    if not (len(block_ids_per_seq) == len(start_positions) == len(num_new_tokens)):
        raise ValueError("block_ids_per_seq, start_positions and num_new_tokens differ in length")
    slots: list[int] = []
    for row, start, n in zip(block_ids_per_seq, start_positions, num_new_tokens, strict=True):
        end = start + n
        if n and (end - 1) // block_size >= len(row):
            raise ValueError(
                f"position {end - 1} needs block {(end - 1) // block_size}, "
                f"row has {len(row)} blocks"
            )
        for pos in range(start, end):
            slots.append(row[pos // block_size] * block_size + pos % block_size)
    if pad_to is not None:
        if pad_to < len(slots):
            raise ValueError(f"pad_to={pad_to} < number of tokens ({len(slots)})")
        slots.extend([PAD_SLOT_ID] * (pad_to - len(slots)))
    return slots


def build_positions(start_positions: Sequence[int], num_new_tokens: Sequence[int]) -> list[int]:
    """Token positions (for rotary embeddings), concatenated in sequence order."""
    out: list[int] = []
    for start, n in zip(start_positions, num_new_tokens, strict=True):
        out.extend(range(start, start + n))
    return out


def build_query_start_loc(num_new_tokens: Sequence[int]) -> list[int]:
    """Prefix sums `[0, n0, n0+n1, ...]`: where each sequence's queries start in the batch."""
    out = [0]
    for n in num_new_tokens:
        out.append(out[-1] + n)
    return out
