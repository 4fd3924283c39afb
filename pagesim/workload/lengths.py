"""Length distributions: prompt and output token counts per request, and think times.

Three sources of (prompt, output) lengths:

- `TraceLengths`: the joint (prompt, output) pairs of a shipped trace's columns, sampled the
  way `vllm bench serve` samples a dataset: a seeded shuffle, the first `n` rows, and when `n`
  exceeds the rows, the extra ones drawn with replacement (vLLM's `maybe_oversample_requests`).
- `ParametricLengths`: independent `Dist`s for prompt and output tokens.
- `RandomLengths`: `vllm bench serve --dataset-name random`: integers uniform in
  [floor(len*(1-r)), ceil(len*(1+r))] (output at least 1), drawn input first then output from
  `default_rng(seed)`, as vLLM's `RandomDataset.get_sampling_params` does, so the lengths equal
  vLLM's for the same seed when the tokenizer adds no special tokens.

`Dist` is also used for think times (seconds) and for system-prompt lengths.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagesim.errors import WorkloadError
from pagesim.utils import MAX_TOKENS

DIST_KINDS: tuple[str, ...] = ("fixed", "uniform", "normal", "lognormal", "exponential")
_DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("mean", "std"),
    "exponential": ("mean",),
}


@dataclass(frozen=True)
class Dist:
    """A parametric distribution of one non-negative quantity (tokens or seconds).

    fixed(value); uniform(low, high), inclusive for integers; normal(mean, std);
    lognormal(mean, std) given as the mean and standard deviation of the values themselves;
    exponential(mean). Draws are rounded (integers) and clipped to [min, max].
    """

    kind: str
    value: float = 0.0
    low: float = 0.0
    high: float = 0.0
    mean: float = 0.0
    std: float = 0.0
    min: float | None = None
    max: float | None = None

    def sample(
        self, rng: np.random.Generator, n: int, *, integer: bool, floor: float
    ) -> np.ndarray:
        """n draws: int64 if `integer`, else float64; never below `floor` nor `self.min`."""
        k = self.kind
        if k == "fixed":
            x = np.full(n, self.value, dtype=np.float64)
        elif k == "uniform":
            if integer:
                x = rng.integers(int(self.low), int(self.high) + 1, size=n).astype(np.float64)
            else:
                x = rng.uniform(self.low, self.high, size=n)
        elif k == "normal":
            x = rng.normal(self.mean, self.std, size=n)
        elif k == "lognormal":
            sigma2 = math.log1p((self.std / self.mean) ** 2)
            x = rng.lognormal(math.log(self.mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
        else:  # exponential
            x = rng.exponential(self.mean, size=n)
        lo = floor if self.min is None else max(floor, self.min)
        x = np.clip(x, lo, self.max if self.max is not None else np.inf)
        return np.rint(x).astype(np.int64) if integer else x


def parse_dist(obj: Any, where: str, *, integer: bool) -> Dist:
    """A `Dist` from a YAML value: a bare number means fixed; else {dist: KIND, params...}."""
    if isinstance(obj, int | float) and not isinstance(obj, bool):
        return _checked(Dist("fixed", value=float(obj)), where, integer)
    if not isinstance(obj, Mapping):
        raise WorkloadError(f"{where} = {obj!r}: expected a number or a distribution mapping")
    kind = obj.get("dist")
    if kind not in DIST_KINDS:
        raise WorkloadError(f"{where}.dist = {kind!r}: expected one of {', '.join(DIST_KINDS)}")
    allowed = {"dist", "min", "max", *_DIST_PARAMS[kind]}
    for key in obj:
        if key not in allowed:
            raise WorkloadError(
                f"{where}.{key}: unknown key for dist {kind!r} "
                f"(allowed: {', '.join(sorted(allowed))})"
            )
    fields: dict[str, float] = {}
    for key in (*_DIST_PARAMS[kind], "min", "max"):
        if key in obj:
            fields[key] = _number(obj[key], f"{where}.{key}")
        elif key not in ("min", "max"):
            raise WorkloadError(
                f"{where}.{key}: missing (dist {kind!r} needs {', '.join(_DIST_PARAMS[kind])})"
            )
    return _checked(Dist(kind, **fields), where, integer)


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise WorkloadError(f"{where} = {v!r}: expected a finite number")
    return float(v)


def _checked(d: Dist, where: str, integer: bool) -> Dist:
    def bad(field: str, value: float | None, why: str) -> WorkloadError:
        return WorkloadError(f"{where}.{field} = {value!r}: {why}")

    if d.kind == "fixed" and d.value < 0:
        raise bad("value", d.value, "must be >= 0")
    if d.kind == "uniform" and not 0 <= d.low <= d.high:
        raise bad("high", d.high, f"need 0 <= low ({d.low}) <= high")
    if d.kind in ("normal", "lognormal", "exponential") and d.mean <= 0:
        raise bad("mean", d.mean, "must be > 0")
    if d.kind in ("normal", "lognormal") and d.std < 0:
        raise bad("std", d.std, "must be >= 0")
    if d.min is not None and d.min < 0:
        raise bad("min", d.min, "must be >= 0")
    if d.min is not None and d.max is not None and d.max < d.min:
        raise bad("max", d.max, f"must be >= min ({d.min})")
    if integer and d.max is not None and d.max < 1:
        raise bad("max", d.max, "must be >= 1 token")
    if integer:  # token counts: bounded so that a draw fits int64 and a machine's memory
        for name in ("value", "low", "high", "mean", "std", "min", "max"):
            v = getattr(d, name, None)
            if v is not None and v > MAX_TOKENS:
                raise bad(name, v, f"must be <= {MAX_TOKENS:,} tokens")
    return d


@dataclass(frozen=True, eq=False)
class TraceLengths:
    """Joint (prompt, output) lengths from a trace's columns. Arrays: int64 [rows]."""

    prompt_lens: np.ndarray
    output_lens: np.ndarray
    source: str  # file the columns came from, for messages

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """n pairs: a seeded shuffle's first rows, then draws with replacement beyond the trace."""
        rows = len(self.prompt_lens)
        idx = rng.permutation(rows)[:n]
        if n > rows:
            idx = np.concatenate([idx, rng.integers(0, rows, size=n - rows)])
        return self.prompt_lens[idx], self.output_lens[idx]


@dataclass(frozen=True)
class ParametricLengths:
    """Prompt and output lengths from two independent distributions."""

    input: Dist
    output: Dist

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        prompt = self.input.sample(rng, n, integer=True, floor=1)
        return prompt, self.output.sample(rng, n, integer=True, floor=1)


@dataclass(frozen=True)
class RandomLengths:
    """`vllm bench serve` random dataset: --random-input-len/-output-len/-range-ratio/-prefix-len.

    The prompt is `prefix_len` shared tokens plus the sampled input length (vLLM prepends the
    prefix to every prompt). Range semantics are the current vLLM ones, r in [0, 1); the legacy
    `benchmark_serving.py` (default 1.0, range [len*r, len]) is not mirrored.
    """

    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0
    prefix_len: int = 0

    def __post_init__(self) -> None:
        for name in ("input_len", "output_len", "prefix_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise WorkloadError(f"random_{name} = {v!r}: must be an integer >= 0")
            if v > MAX_TOKENS:
                raise WorkloadError(f"random_{name} = {v!r}: must be <= {MAX_TOKENS:,} tokens")
        r = self.range_ratio
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0.0 <= r < 1.0:
            raise WorkloadError(f"random_range_ratio = {r!r}: must be in [0, 1)")
        if self.output_len < 1:
            raise WorkloadError(f"random_output_len = {self.output_len}: must be >= 1")
        if self.prefix_len + math.floor(self.input_len * (1 - r)) < 1:
            raise WorkloadError(
                f"random_input_len = {self.input_len}: with range ratio {r} and "
                f"prefix {self.prefix_len} a prompt could have 0 tokens"
            )

    def bounds(self) -> tuple[int, int, int, int]:
        """(input_low, input_high, output_low, output_high), inclusive, as vLLM computes them."""
        r = self.range_ratio
        in_lo = math.floor(self.input_len * (1 - r))
        in_hi = math.ceil(self.input_len * (1 + r))
        out_lo = max(math.floor(self.output_len * (1 - r)), 1)
        out_hi = max(math.ceil(self.output_len * (1 + r)), 1)
        return in_lo, in_hi, out_lo, out_hi

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(input lengths without the prefix, output lengths), int64 [n]: vLLM's draw order."""
        in_lo, in_hi, out_lo, out_hi = self.bounds()
        inputs = rng.integers(in_lo, in_hi + 1, size=n).astype(np.int64)
        outputs = rng.integers(out_lo, out_hi + 1, size=n).astype(np.int64)
        return inputs, outputs


LengthModel = TraceLengths | ParametricLengths | RandomLengths
