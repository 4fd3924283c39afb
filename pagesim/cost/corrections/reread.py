"""Correction `reread`: reads of cached prefix blocks that several sequences of a step share.

A step reads a shared block for every sequence that holds it, but the reads after the first
come from the L2 cache and concurrent first reads are served together, so a token of a shared
block costs r of a private read per reading sequence. A decode step is priced at the mean
effective context (context - (1 - r) * shared) / sequences; a step through the variable-length
kernel discounts its launch's context reads alike (`Launch.reread`). r in [0, 1] (steps of
0.01) is fitted per block size on rows timed against unshared references in the same rounds:
decode_shared_spread.csv (a served batch behind one system prompt) where a block size has them,
else decode_shared.csv; varlen_shared.csv for the kernel. Needs the shared count
(`BatchShape.shared_context_tokens`). Off: every context is its own. Switched off, the shipped
profiles' held-out MAPE rises 0.08 to 0.59 points (docs/cost_model.md).
"""

from __future__ import annotations

from pagesim.cost.base import BatchShape
from pagesim.cost.corrections import by_block_size
from pagesim.cost.profile import Profile
from pagesim.cost.varlen_launch import shape_launch


def fit_decode_reread(model, profile: Profile) -> dict[int, float]:
    """Block size -> a shared-block token's cost per reading sequence of a decode step, as a
    fraction of a private one: on the block size's spread rows, each priced whole by `model`
    (so `spread` is fitted first), where it has them (served batches are never uniform); else
    on its uniform rows, each through the decode surface at its padded batch."""
    out: dict[int, float] = {}
    uniform = dict(by_block_size(profile.decode_shared, model._decode))
    spread = dict(by_block_size(profile.decode_shared_spread, model._decode))
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
                p = model.padded_batch(r.batch_size)
                other = model._other_for(model._decode_graph(r.batch_size), p)
                ratio = _uniform_ratio(model._decode[bs], other, p, r.context_len, r.shared_len)
                cases.append((ratio, r.step_time_ms / r.reference_step_time_ms))

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


def best_fraction(error) -> float:
    """The fraction in 0, 0.01, ..., 1 with the smallest `error(fraction)` (the first on ties)."""
    return min((k / 100 for k in range(101)), key=error)


def fit_varlen_reread(model, profile: Profile) -> dict[int, float]:
    """Block size -> the cost of a shared-block token in the variable-length kernel
    (varlen_shared.csv), the fraction in [0, 1] (steps of 0.01) that best reproduces each
    row's ratio to its unshared reference, as `fit_decode_reread` does for decode steps."""
    out: dict[int, float] = {}
    for bs, rs in by_block_size(profile.varlen_shared, model._varlen):
        fit = model._varlen[bs]
        cases = []
        for r in rs:
            d, dc, sh = r.num_decodes, r.decode_context_len, r.shared_len
            k, n = r.num_entries, r.num_new_tokens
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

        # each fraction discounts the row's one launch (`model._discounted` of the shape's launch)
        def error(frac: float, fit=fit, cases=cases) -> float:
            total = 0.0
            for shape, padded, other, plain, ratio, launch in cases:
                priced = other + fit(model._discounted(launch, shape, frac), padded is not None)
                total += (priced / plain - ratio) ** 2
            return total

        out[bs] = best_fraction(error)
    return out
