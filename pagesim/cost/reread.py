"""Shared-prefix read costs, fitted on a profile's shared-prefix rows.

A step whose sequences share cached prefix blocks reads each of those blocks for every
sequence that holds it, but the reads after the first come from the L2 cache and the
concurrent first reads of one block are served together. Each shared-prefix row was timed with
its unshared reference in the same rounds; the fraction r in [0, 1] (steps of 0.01) that best
reproduces the rows' ratios to their references is what a token in a shared block costs, per
reading sequence, as a share of a private one.
`CalibratedCostModel` calls these once, with itself as `model` (they read its fitted lines
and surfaces).
"""

from __future__ import annotations

from collections import defaultdict

from pagesim.cost.base import BatchShape
from pagesim.cost.profile import Profile
from pagesim.cost.varlen import shape_launch


def fit_decode_reread(model, profile: Profile) -> dict[int, float]:
    """Block size -> the cost of reading a token of a shared block, per reading sequence
    of a decode step, as a fraction of a private token (decode_shared.csv and
    decode_shared_spread.csv).

    A decode step reads every sequence's context; a prefix that several sequences share is
    the same blocks. The step is priced as if each sequence had the mean *effective* context
    (context - (1 - r) * shared tokens) / sequences; r is the value in [0, 1] (steps of
    0.01) that best reproduces each row's ratio of its shared time to its reference time
    (the same step over distinct blocks, timed in the same session), so rows measured in
    another session of the same model and GPU fit as well as this profile's own.

    A block size with spread rows (decode_shared_spread.csv: every sequence the shared prefix
    plus an own part of its own length, as a served batch behind one system prompt) is fitted
    on those alone, each priced whole by `model`, the unequal programs included (so the
    model's decode spread must be fitted first); else on its uniform rows, each through the
    decode surface at its padded batch. Why the spread rows decide: on llama-2-7b's H200 rows
    of two calls they put r at 0.64-0.65 and the uniform rows of the same calls at 0.71-0.72,
    and the served system-prompt decode steps of 100-150 sequences are priced exactly at
    r = 0.645 (median over the steps of the shipped run); served batches are never uniform.
    """
    out: dict[int, float] = {}
    uniform = dict(_by_block_size(profile.decode_shared, model._decode))
    spread = dict(_by_block_size(profile.decode_shared_spread, model._decode))
    for bs in sorted(uniform.keys() | spread.keys()):
        cases = []
        for r in spread.get(bs, ()):
            shape = shared_spread_shape(r)
            plain = model._parts(shape, reread=1.0)[0]
            cases.append(
                (
                    lambda f, shape=shape, plain=plain: model._parts(shape, reread=f)[0] / plain,
                    r.step_time_ms / r.reference_step_time_ms,
                )
            )
        if not cases:  # no served-like rows at this block size: the uniform ones
            for r in uniform.get(bs, ()):
                p = model._padded_decode(r.batch_size)
                other = model._other_for(model._decode_graph(r.batch_size), p)
                cases.append(
                    (
                        _uniform_ratio(model._decode[bs], other, p, r.context_len, r.shared_len),
                        r.step_time_ms / r.reference_step_time_ms,
                    )
                )

        def error(frac: float, cases=cases) -> float:
            return sum((ratio(frac) - measured) ** 2 for ratio, measured in cases)

        out[bs] = best_fraction(error)
    return out


def _uniform_ratio(surface, other: float, padded: int, context: int, shared: int):
    """A uniform shared row's ratio to its reference at re-read cost f, as a function of f."""
    plain = other + surface(padded, context)
    return lambda f: (other + surface(padded, context - (1.0 - f) * shared)) / plain


def shared_spread_shape(r) -> BatchShape:
    """The decode step of a decode_shared_spread row: contexts evenly from
    2 * mean - longest to longest, every one starting with the `shared_len` shared tokens."""
    b, mean, longest = r.batch_size, r.context_len, r.longest_context_len
    low = 2 * mean - longest
    contexts = [round(low + i * (longest - low) / (b - 1)) if b > 1 else mean for i in range(b)]
    return BatchShape(
        r.block_size,
        b,
        b,
        sum(contexts),
        contexts,
        [],
        [],
        shared_context_tokens=b * r.shared_len if b > 1 else 0,
    )


def _by_block_size(rows, fitted: dict) -> list[tuple[int, list]]:
    """`rows` grouped by block size, ascending, for the block sizes `fitted` has."""
    by_bs: dict[int, list] = defaultdict(list)
    for r in rows:
        if r.block_size in fitted:
            by_bs[r.block_size].append(r)
    return sorted(by_bs.items())


def best_fraction(error) -> float:
    """The fraction in 0, 0.01, ..., 1 with the smallest `error(fraction)` (the first on ties)."""
    return min((k / 100 for k in range(101)), key=error)


def fit_varlen_reread(model, profile: Profile) -> dict[int, float]:
    """Block size -> the cost of a shared-block token in the variable-length kernel
    (varlen_shared.csv), the fraction in [0, 1] (steps of 0.01) that best reproduces each
    row's ratio to its unshared reference, as `fit_decode_reread` does for decode steps."""
    out: dict[int, float] = {}
    for bs, rs in _by_block_size(profile.varlen_shared, model._varlen):
        fit = model._varlen[bs]
        cases = []
        for r in rs:
            d, dc, k, n, sh = (
                r.num_decodes,
                r.decode_context_len,
                r.num_entries,
                r.num_new_tokens,
                r.shared_len,
            )
            shape = BatchShape(
                bs,
                d + k * n,
                d,
                d * dc,
                [dc] * d,
                [n] * k,
                [sh] * k,
                shared_context_tokens=(d + k) * sh if d + k > 1 else 0,
            )
            padded = model.padded_tokens(shape.total_tokens)
            other = model._other_for(padded is not None, padded or shape.total_tokens)
            launch = shape_launch(model._varlen_kernel, shape, padded)
            plain = other + fit(launch, padded is not None)
            cases.append(
                (shape, padded, other, plain, r.step_time_ms / r.reference_step_time_ms, launch)
            )

        # each fraction discounts the row's one launch (`model._varlen_launch` of the shape)
        def error(frac: float, fit=fit, cases=cases) -> float:
            return sum(
                (
                    (other + fit(model._discounted(launch, shape, frac), padded is not None))
                    / plain
                    - ratio
                )
                ** 2
                for shape, padded, other, plain, ratio, launch in cases
            )

        out[bs] = best_fraction(error)
    return out
