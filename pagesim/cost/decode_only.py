"""Decode-only steps priced without building a `BatchShape`.

Near saturation most simulated steps are decodes and nothing else (the decode fast path's
lead-only steps). `decode_only_pricer(model)` returns a function that gives
`model.step_time(shape)` for such a shape, float for float: the same operations in the same
order as `CalibratedCostModel._components` and `_parts` take for a decode-only shape, without
the shape object and the four calls in between. Whatever this path has not seen yet (a block
size or batch size whose memo entries `_parts` fills on first use) goes through `step_time`
itself. `tests/cost/test_decode_only.py` holds the two to equality.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pagesim.cost.base import BatchShape, longest_context
from pagesim.cost.calibrated import CalibratedCostModel

# (block_size, num_seqs, context_sum, contexts, shared_context_tokens) -> seconds
DecodePricer = Callable[[int, int, int, Sequence[int], "int | None"], float]


def decode_only_pricer(model) -> DecodePricer | None:
    """The decode-only pricer of `model`, or None for a model it does not know (then price a
    `BatchShape` with `model.step_time`)."""
    if type(model) is not CalibratedCostModel:
        return None

    def price(
        block_size: int,
        num_seqs: int,
        context_sum: int,
        contexts: Sequence[int],
        shared: int | None,
    ) -> float:
        """`model.step_time` of `num_seqs` decodes (>= 1) over `contexts` (their sum
        `context_sum`), reading `shared` context tokens from shared blocks (None: unknown)."""
        weights = model._weights.get(block_size)
        base = model._decode_base.get(num_seqs)
        host = model._host_memo.get(num_seqs) if model._host else 0.0
        spread = model._spread
        kappa = model._spread_frac.get(block_size) if spread else 0.0
        reread = shared and model._reread
        frac = model._reread_frac.get(block_size) if reread else 0.0
        if weights is None or base is None or host is None or kappa is None or frac is None:
            return model.step_time(
                BatchShape(
                    block_size,
                    num_seqs,
                    num_seqs,
                    context_sum,
                    contexts,
                    shared_context_tokens=shared,
                )
            )  # fills the memos above
        # ---- `_parts`, decode-only branch
        graph, n, other = base
        total = other
        work: float = context_sum
        if reread and shared:  # reread is truthy only with shared tokens
            work -= (1.0 - frac) * min(shared, context_sum)
        c = work / (n if spread else num_seqs)
        for w, s in weights[0]:
            total += w * s(n, c)
        if spread:
            total += kappa * model._decode_kernel.program_spread(  # type: ignore[union-attr]
                n, graph, context_sum / num_seqs, longest_context(contexts)
            )
        # ---- `_components`
        attention = total - other
        if total < 0.0:
            other = attention = 0.0
        allreduce = model._allreduce(num_seqs) if model._allreduce is not None else 0.0
        if not model._allreduce_added:
            allreduce = min(allreduce, max(other, 0.0))
            other -= allreduce
        return sum((other, attention, allreduce, host, 0.0, 0.0))

    return price
