"""Service-level objectives: parsing and checking them against a run's result.

Two forms, both from vLLM's tooling:

- A bound on a result key, as `vllm bench sweep serve_sla` writes them:
  `p99_ttft_ms<=500`, `mean_tpot_ms < 50`, `p95.5_e2el_ms<=2000`, `output_throughput>=1000`,
  or the JSON form `{"p99_e2el_ms": "<=500"}`. Latency keys are `{stat}_{metric}_ms` with
  stat `mean`, `median`, `std` or `pN` (any percentile) and metric `ttft`, `tpot`, `itl`,
  `e2el`; any other numeric key of the result (`RESULT_KEYS`) can be bounded too.
- A per-request goodput SLO, as `vllm bench serve --goodput ttft:500 tpot:50`: a request is
  good when it meets every such threshold (DistServe's definition, which vllm bench uses).
  A run meets them when the share of good requests among all sent (failed ones count as not
  good) is at least `attainment` (DistServe's 90 % by default).

Bad strings raise `ConfigError` with one line naming the string.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pagesim.errors import ConfigError
from pagesim.metrics.report import MEAN_KEYS, PEAK_KEYS, SUMMED_KEYS
from pagesim.utils import readable

LATENCY_KEY = re.compile(r"^(mean|median|std|p(\d+(?:\.\d+)?))_(ttft|tpot|itl|e2el)_ms$")
GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")
OPERATORS: tuple[str, ...] = ("<=", ">=", "<", ">")  # two-character ones first
DEFAULT_ATTAINMENT = 0.9
# Numeric keys of `simulate(...).result` besides the latency statistics.
RESULT_KEYS: tuple[str, ...] = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *SUMMED_KEYS,
    *PEAK_KEYS,
    *MEAN_KEYS,
    "prefix_cache_hit_rate",
    "num_gpu_blocks",
)

_BOUND = re.compile(r"^\s*([A-Za-z0-9_.]+)\s*(<=|>=|<|>)\s*([-+0-9.eE]+|inf)\s*$")


@dataclass(frozen=True)
class Bound:
    """`key op value` over a run's result, e.g. p99_ttft_ms <= 500."""

    key: str
    op: str
    value: float

    def shown(self, x: float) -> str:
        """`x` for a person (`readable`), with as many more digits as it takes for a value
        that breaks the bound not to read as the limit itself (`25.004` against `<= 25`)."""
        shown = readable(x)
        for digits in range(5, 10):
            if not math.isfinite(x) or shown.replace(",", "") != f"{self.value:g}":
                break
            shown = f"{x:.{digits}g}"
        return shown

    def holds(self, result: Mapping[str, Any]) -> bool:
        x = result.get(self.key)
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return False
        x = float(x)
        return {
            "<=": x <= self.value,
            "<": x < self.value,
            ">=": x >= self.value,
            ">": x > self.value,
        }[self.op]

    @property
    def percentile(self) -> float | None:
        m = LATENCY_KEY.match(self.key)
        return float(m.group(2)) if m and m.group(2) else None

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value:g}"


@dataclass(frozen=True)
class SLOSpec:
    """Bounds plus per-request goodput thresholds (ms) with their required attainment."""

    bounds: tuple[Bound, ...] = ()
    goodput_ms: tuple[tuple[str, float], ...] = ()  # (("ttft", 500.0), ...), vllm bench order
    attainment: float = DEFAULT_ATTAINMENT
    # False: a run that rejected any request meets no SLO (its latencies describe only the
    # requests it served); True: plan for the served requests alone (--allow-rejected).
    allow_rejected: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.attainment <= 1.0:
            raise ConfigError(f"slo attainment={self.attainment!r}: must be in (0, 1]")

    @property
    def empty(self) -> bool:
        return not self.bounds and not self.goodput_ms

    def percentiles(self, base: Iterable[float] = (99,)) -> tuple[float, ...]:
        """`base` plus every percentile a bound needs, sorted, without duplicates."""
        wanted = {float(p) for p in base}
        wanted.update(b.percentile for b in self.bounds if b.percentile is not None)
        return tuple(int(p) if p.is_integer() else p for p in sorted(wanted))

    def check(self, result: Mapping[str, Any]) -> tuple[bool, tuple[str, ...]]:
        """(all met, one line per violated objective with the value found)."""
        violations = []
        rejected = int(result.get("num_rejected") or 0)
        if rejected and not self.allow_rejected:
            violations.append(f"{rejected} requests rejected (--allow-rejected plans without them)")
        for b in self.bounds:
            if not b.holds(result):
                found = result.get(b.key)
                shown = b.shown(found) if isinstance(found, int | float) else repr(found)
                violations.append(f"{b} (got {shown})")
        if self.goodput_ms:
            share = goodput_attainment(result)
            if share is None or share < self.attainment:
                slos = " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
                got = "n/a" if share is None else f"{share:.3f}"
                violations.append(f"goodput {slos} attainment>={self.attainment:g} (got {got})")
        return not violations, tuple(violations)

    def usage(self, result: Mapping[str, Any]) -> list[tuple[str, float, str]]:
        """(objective, share of its limit used, value found) per objective; a share > 1
        is a violation. For `<=` bounds the share is value / limit; for `>=`, limit / value;
        for goodput, the attainment asked / the attainment found."""
        out = []
        for b in self.bounds:
            x = result.get(b.key)
            x = math.nan if x is None else float(x)
            if b.op in ("<=", "<"):
                used = x / b.value if b.value > 0 else (math.inf if x > 0 else 0.0)
            else:
                used = b.value / x if x > 0 else math.inf
            out.append((str(b), used, b.shown(x)))
        if self.goodput_ms:
            share = goodput_attainment(result)
            slos = "goodput " + " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
            used = self.attainment / share if share else math.inf
            out.append((slos, used, "n/a" if share is None else f"{share:.3f} attained"))
        return out

    def __str__(self) -> str:
        parts = [str(b) for b in self.bounds]
        if self.goodput_ms:
            parts.append(
                " ".join(f"{k}:{v:g}" for k, v in self.goodput_ms)
                + f" (>= {self.attainment:.0%} of requests)"
            )
        return ", ".join(parts) or "none"


def goodput_attainment(result: Mapping[str, Any]) -> float | None:
    """Share of sent requests that met every goodput SLO: request_goodput * duration is the
    number of good requests (vllm bench's request_goodput is good requests / duration)."""
    goodput = result.get("request_goodput")
    if goodput is None:
        return None
    sent = int(result.get("completed", 0)) + int(result.get("failed", 0))
    return round(goodput * result["duration"]) / sent if sent else None


def parse_slo(text: str) -> list[Bound | tuple[str, float]]:
    """One `--slo` string: a bound (`p99_ttft_ms<=500`) or vllm bench goodput items
    (`ttft:500 tpot:50`, each a (metric, ms) pair)."""
    s = str(text).strip()
    if not s:
        raise ConfigError("--slo '': empty objective")
    if any(op in s for op in OPERATORS):
        return [_parse_bound(s)]
    return [_parse_goodput(part, s) for part in s.split()]


def _parse_bound(s: str) -> Bound:
    m = _BOUND.match(s)
    if m is None:
        raise ConfigError(f"--slo {s!r}: expected KEY<=VALUE, e.g. p99_ttft_ms<=500")
    key, op, raw = m.groups()
    if not (LATENCY_KEY.match(key) or key in RESULT_KEYS):
        raise ConfigError(
            f"--slo {s!r}: unknown metric {key!r} (latency keys look like "
            "p99_ttft_ms, mean_tpot_ms; or a result key such as output_throughput)"
        )
    pct = LATENCY_KEY.match(key)
    if pct and pct.group(2) and not 0 < float(pct.group(2)) < 100:
        raise ConfigError(f"--slo {s!r}: percentile {pct.group(2)} must be in (0, 100)")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"--slo {s!r}: {raw!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"--slo {s!r}: the bound must be a finite number >= 0")
    return Bound(key, op, value)


def _parse_goodput(part: str, whole: str) -> tuple[str, float]:
    metric, sep, raw = part.partition(":")
    if not sep or metric not in GOODPUT_METRICS:
        raise ConfigError(
            f"--slo {whole!r}: expected KEY<=VALUE (p99_ttft_ms<=500) or "
            "vllm bench goodput items ttft:MS, tpot:MS, e2el:MS"
        )
    try:
        ms = float(raw)
    except ValueError:
        raise ConfigError(f"--slo {whole!r}: {raw!r} is not a number") from None
    if not (ms > 0 and math.isfinite(ms)):
        raise ConfigError(f"--slo {whole!r}: {metric} threshold must be > 0 ms and finite")
    return metric, ms


def parse_slos(
    items: Iterable[str] | Mapping[str, Any] | None,
    attainment: float = DEFAULT_ATTAINMENT,
    allow_rejected: bool = False,
) -> SLOSpec:
    """Many `--slo` strings, or the JSON/YAML mapping form {"p99_e2el_ms": "<=500"}."""
    if items is None:
        return SLOSpec(attainment=attainment, allow_rejected=allow_rejected)
    if isinstance(items, Mapping):
        items = [
            f"{k}{v}" if str(v).lstrip()[:1] in "<>" else f"{k}<={v}" for k, v in items.items()
        ]
    bounds: list[Bound] = []
    goodput: dict[str, float] = {}
    for item in items:
        for slo in parse_slo(item):
            if isinstance(slo, Bound):
                bounds.append(slo)
            else:
                goodput[slo[0]] = slo[1]
    return SLOSpec(tuple(bounds), tuple(goodput.items()), attainment, allow_rejected)
