"""Correction `spread`: decode steps whose contexts differ in length.

The decode rows give every sequence one context; served steps mix short and long ones, which
changes two things of the decode kernel's launch (`pagesim.cost.decode_launch`). A CUDA graph's
padding sequences own no context, so the step is priced at its padded batch with the real
context sum spread over the padded rows. And a step whose programs differ in length outlasts
one where every sequence has the mean context: decode_spread.csv times such steps against
uniform twins in the same rounds, and the extra time is fitted per block size as kappa *
(longest program - mean program), in seconds per token. Needs the decode kernel's launch
parameters and spread rows. Off: a decode step is priced at its padded batch and its mean real
context. Switched off, the shipped profiles' held-out MAPE moves -0.03 to +0.05 points: only
their decode_shared_spread rows have unequal contexts (docs/cost_model.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagesim.cost.base import BatchShape
from pagesim.cost.corrections import by_block_size
from pagesim.cost.decode_launch import DecodePartition, span_bucket, split_rule
from pagesim.cost.profile import Profile
from pagesim.specs import shipped_spec

#: Partition size that stands for "no split" (longer than any context).
NO_SPLIT = 1 << 40


@dataclass
class DecodeKernel:
    """What the cost model needs of the decode kernel's launch: its tile, programs per SM,
    the GPU's SMs, the model's KV heads per GPU, the graphs' span limit and the window."""

    tile_n: int
    programs_per_sm: int
    num_sms: int
    num_kv_heads: int
    max_model_len: int
    sliding_window: int | None = None
    _memo: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, profile: Profile) -> DecodeKernel | None:
        """The profile's decode kernel, or None when the profile does not record it."""
        meta = profile.metadata
        sms = meta.device.get("num_sms") if isinstance(meta.device, dict) else None
        spec = shipped_spec(meta.model)
        heads = meta.kv_heads_per_gpu  # None only for a model pagesim does not know (no spec)
        if not (meta.decode_tile_n and meta.decode_programs_per_sm and sms and spec and heads):
            return None
        return cls(
            meta.decode_tile_n,
            meta.decode_programs_per_sm,
            int(sms),
            heads,
            spec.max_position_embeddings,
            spec.uniform_window,
        )

    def partition_size(self, num_seqs: int, span: int) -> int:
        """Tokens per partition of a step of `num_seqs` sequences over `span` tokens
        (`NO_SPLIT` when the kernel does not split), memoized: the rule loops over splits."""
        key = (num_seqs, span)
        size = self._memo.get(key)
        if size is None:
            part: DecodePartition = split_rule(
                num_seqs,
                self.num_kv_heads,
                span,
                self.tile_n,
                self.programs_per_sm,
                self.num_sms,
                self.sliding_window,
            )
            size = self._memo[key] = part.partition_size if part.num_partitions > 1 else NO_SPLIT
        return size

    def program_spread(
        self, num_seqs: int, graph: bool, mean_context: float, longest_context: int
    ) -> float:
        """Longest program minus the mean one (tokens) of a decode step of `num_seqs`
        (padded) sequences: a graph's partitions follow its span bucket, an eager step's its
        longest context. Contexts are before the step; each sequence reads one more token."""
        longest = longest_context + 1
        span = span_bucket(longest, self.max_model_len) if graph else longest
        if self.sliding_window:
            longest = min(longest, self.sliding_window)
            mean_context = min(mean_context, self.sliding_window - 1)
        size = self._memo.get((num_seqs, span)) or self.partition_size(num_seqs, span)
        if size >= longest:  # one partition covers every sequence (the common case)
            return max(0.0, longest - mean_context - 1)
        return max(0.0, size - min(size, mean_context + 1))


def fit_decode_spread(model, profile: Profile, kernel: DecodeKernel | None) -> dict[int, float]:
    """Block size -> seconds per token of (longest - mean) program length, least squares
    through the origin over the block size's decode_spread rows (empty without rows or
    without the kernel). Each row's extra time is its ratio to its uniform twin, minus one,
    times the model's price of the uniform step, so rows from another GPU call of the same
    model fit as well as the profile's own."""
    if kernel is None:
        return {}
    out: dict[int, float] = {}
    for bs, rows in by_block_size(profile.decode_spread, model._decode):
        sxx = sxy = 0.0
        for r in rows:
            graph = model._decode_graph(r.batch_size)
            padded = model.padded_batch(r.batch_size)
            uniform = model._parts(BatchShape.decode(r.batch_size, r.context_len, bs))[0]
            y = (r.step_time_ms / r.uniform_step_time_ms - 1.0) * uniform
            x = kernel.program_spread(padded, graph, r.context_len, r.longest_context_len)
            sxx += x * x
            sxy += x * y
        if sxx > 0:
            out[bs] = max(0.0, sxy / sxx)
    return out
