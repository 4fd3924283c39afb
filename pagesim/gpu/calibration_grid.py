"""What `pagesim calibrate` measures: the grid of step shapes, and the rows it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pagesim.cost import profile


def median_p10_p90(values) -> tuple[float, float, float]:
    """The median and the 10th and 90th percentiles of repeated timings: what every measured
    row of a profile keeps of its samples."""
    a = np.asarray(values)
    return float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90))


@dataclass(frozen=True)
class CalibrationGrid:
    """The shapes to measure. Points that exceed the model or the cache are dropped."""

    block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    # every CUDA-graph capture size up to 64 but 2 (a batch between two rows replays the
    # larger graph, whose split can differ from both neighbours': llama-2-13b's 24 runs
    # unsplit where 16 and 32 split), then coarser: past 64 the splits change slowly
    decode_batches: tuple[int, ...] = (1, 4, 8, 16, 24, 32, 48, 64, 128, 192, 256, 384, 512)
    decode_contexts: tuple[int, ...] = (128, 512, 1024, 2048, 4096, 8192)
    # 384/512 and 768 pin both sides of the largest mixed graph (512 tokens)
    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 384, 512, 768, 1024, 2048, 4096, 8192)
    prefill_cached: tuple[int, ...] = (0, 1024, 4096)
    # (new tokens, cached tokens, decode batch, decode context): a few large chunks, and the
    # steps a served run admits a request in (a chunk of <= 512 tokens with or without a
    # cached prefix joining a batch of long decodes: a mixed graph)
    mixed: tuple[tuple[int, int, int, int], ...] = (
        (256, 0, 32, 512),
        (1024, 0, 32, 512),
        (256, 0, 128, 512),
        (1024, 0, 128, 512),
        (2048, 1024, 64, 1024),
    ) + tuple(
        (n, k, b, c)
        for b in (16, 48, 96)
        for c in (1024, 2048)
        for n in (128, 384)
        for k in (0, 1024)
    )
    # (entries, new tokens per entry, cached tokens per entry)
    multi_prefill: tuple[tuple[int, int, int], ...] = tuple(
        (k, n, c) for k in (2, 4, 8, 16) for n in (32, 128, 512) for c in (0, 1024)
    )
    # (decode batch, context per sequence, shared prefix tokens: a multiple of 128)
    decode_shared: tuple[tuple[int, int, int], ...] = tuple(
        (b, c, s) for b in (16, 64, 256) for c in (1024, 2048) for s in (c // 2, c - c // 8)
    )
    # (decode batch, shared prefix tokens, mean own tokens, half width): every sequence holds
    # the prefix and then its own part, spread evenly over mean +- width, as a served batch
    # behind one cached system prompt (the uniform rows above give every sequence one
    # context). Batches up to 128: llama-2-7b's unshared reference of 128 x ~1,500 tokens is
    # about what an H200 holds.
    decode_shared_spread: tuple[tuple[int, int, int, int], ...] = tuple(
        (b, s, 512, 448) for b in (32, 64, 128) for s in (512, 1024)
    )
    # (decodes, decode context, prefill entries, new tokens each, shared prefix tokens): the
    # variable-length kernel over a shared prefix (a multiple of 128)
    varlen_shared: tuple[tuple[int, int, int, int, int], ...] = (
        (0, 0, 4, 128, 1024),
        (0, 0, 16, 32, 1024),
        (32, 1280, 1, 256, 1024),
        (128, 1280, 1, 128, 1024),
        (64, 2304, 2, 128, 2048),
        (24, 1536, 1, 256, 1024),
        (48, 1792, 1, 128, 1280),
        (96, 2048, 1, 128, 1536),
    )
    # (decode batch, mean context, half width): contexts spread evenly over mean +- width.
    # A graph's partitions follow its longest context's span bucket: 1,800 +- 600 and +- 1,700
    # run in the 4,096 bucket and their uniform twin (all 1,800) in the 2,048 one, so their
    # ratio holds a partition change beside the spread. 2,900 +- 1,100 and 2,100 +- 1,900 run
    # in the same bucket as their twins, up to 128 sequences (where 4 KV heads run unsplit).
    decode_spread: tuple[tuple[int, int, int], ...] = tuple(
        (b, 1800, w) for b in (4, 8, 16, 24, 32, 64) for w in (600, 1700)
    ) + tuple(
        (b, c, w) for b in (4, 8, 16, 24, 32, 64, 96, 128) for c, w in ((2900, 1100), (2100, 1900))
    )
    # Block sizes that get the full grid; any others get decode rows only (the block size
    # changes the attention kernels, which the decode rows measure; `other` is shared) and
    # take the fits of the full tables (decode spread, variable-length kernel, re-reads) from
    # the nearest full block size. Every size is full by default: from a block of 64 tokens
    # on, a decode tile lies in one block and the kernel loads one block id per tile instead
    # of one per token, another inner loop, and below 16 the tables' shapes cross more block
    # boundaries, so fits carried across them misprice served steps (docs/validation.md,
    # "Out-of-sample validation"). What the full grid costs: docs/cost_model.md.
    full_block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128)
    overhead_max_reqs: int = 256
    repeats: int = 5  # timed rounds (each times every point once)
    min_repeats: int = 3  # rounds kept even when the deadline is near

    def to_json(self) -> dict[str, list[int]]:
        return {
            "block_sizes": list(self.block_sizes),
            "decode_batches": list(self.decode_batches),
            "decode_contexts": list(self.decode_contexts),
            "prefill_tokens": list(self.prefill_tokens),
            "prefill_cached": list(self.prefill_cached),
            "full_block_sizes": list(self.full_block_sizes),
            "multi_prefill_entries": sorted({k for k, _, _ in self.multi_prefill}),
            "multi_prefill_tokens": sorted({n for _, n, _ in self.multi_prefill}),
            "multi_prefill_cached": sorted({c for _, _, c in self.multi_prefill}),
            "decode_shared_batches": sorted({b for b, _, _ in self.decode_shared}),
            "decode_shared_contexts": sorted({c for _, c, _ in self.decode_shared}),
            "decode_shared_prefixes": sorted({s for _, _, s in self.decode_shared}),
            "varlen_shared_decodes": sorted({v[0] for v in self.varlen_shared}),
            "varlen_shared_entries": sorted({v[2] for v in self.varlen_shared}),
            "varlen_shared_prefixes": sorted({v[4] for v in self.varlen_shared}),
            "decode_spread_batches": sorted({b for b, _, _ in self.decode_spread}),
            "decode_spread_contexts": sorted({c for _, c, _ in self.decode_spread}),
            "decode_spread_half_widths": sorted({w for _, _, w in self.decode_spread}),
            "decode_shared_spread_batches": sorted({v[0] for v in self.decode_shared_spread}),
            "decode_shared_spread_prefixes": sorted({v[1] for v in self.decode_shared_spread}),
        }


class CalibrationRows(NamedTuple):
    """Measured rows, one list per profile table (the fields are `Profile`'s table names)."""

    decode: list[profile.DecodeRow]
    prefill: list[profile.PrefillRow]
    mixed: list[profile.MixedRow]
    multi_prefill: list[profile.MultiPrefillRow]
    decode_shared: list[profile.DecodeSharedRow]
    varlen_shared: list[profile.VarlenSharedRow]
    decode_spread: list[profile.DecodeSpreadRow]
    decode_shared_spread: list[profile.DecodeSharedSpreadRow]

    @classmethod
    def empty(cls) -> CalibrationRows:
        return cls([], [], [], [], [], [], [], [])

    def add(self, table: str, *fields: object) -> None:
        """Append a row of `fields` to `table`, of that table's row type."""
        getattr(self, table).append(profile.TABLES[table][0](*fields))

    def extend(self, other: CalibrationRows) -> None:
        """Append `other`'s rows (another block size) to these, table by table."""
        for mine, theirs in zip(self, other, strict=True):
            mine.extend(theirs)

    def tables(self) -> dict[str, tuple]:
        """Keyword arguments for `Profile`: table name -> rows."""
        return {name: tuple(rows) for name, rows in zip(self._fields, self, strict=True)}

    def summary(self) -> str:
        """One log line: rows per table."""
        return (
            ", ".join(
                f"{len(rows)} {name.replace('_', '-')}"
                for name, rows in zip(self._fields, self, strict=True)
            )
            + " rows"
        )
