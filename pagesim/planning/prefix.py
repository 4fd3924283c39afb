"""Prefix caching studies: tenants on a shared cache, and the timing side channel it opens.

A shared prefix cache makes a request whose prefix another tenant sent recently faster
(its TTFT skips the cached prefill), so a tenant can learn what others sent by timing its
own probes. vLLM's per-request `cache_salt` goes into the first block's hash, so tenants with
different salts never share a block and the probe's TTFT no longer depends on others.

`probe_attack` stages that attack on one engine with explicit requests: a victim sends a
prompt with a secret prefix; later an attacker sends a probe that starts with the same
prefix (a right guess) and one with another prefix (a wrong guess). The gap between the two
probes' TTFTs is the signal; with salts it closes. `tenant_workload` writes a workload spec
with tenants (per-tenant salts) or with one salt for all (a shared cache), the same requests
otherwise (tenant draws use their own random stream).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import pandas as pd
import yaml

from pagesim.config import EngineConfig
from pagesim.data import workloads_dir
from pagesim.metrics import MetricsCollector
from pagesim.request import Request
from pagesim.sim.cluster import simulate_requests


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> list[int]:
    return [int(t) for t in rng.integers(1, vocab, size=n)]


def probe_attack(
    config: EngineConfig,
    prefix_len: int,
    *,
    salted: bool,
    suffix_len: int = 32,
    seed: int = 0,
    profile: str | Path | None = None,
) -> dict[str, float]:
    """TTFT (ms) of an attacker's right and wrong guesses of a victim's `prefix_len`-token
    prefix, with per-tenant salts (`salted`) or one shared cache."""
    rng = np.random.default_rng([seed, prefix_len])
    vocab = config.model_spec.vocab_size
    secret, other = _tokens(rng, prefix_len, vocab), _tokens(rng, prefix_len, vocab)
    victim_salt, attacker_salt = ("victim", "attacker") if salted else (None, None)
    reqs = [
        Request("victim", secret + _tokens(rng, suffix_len, vocab), 8, victim_salt, 0.0),
        Request("right-guess", secret + _tokens(rng, suffix_len, vocab), 1, attacker_salt, 10.0),
        Request("wrong-guess", other + _tokens(rng, suffix_len, vocab), 1, attacker_salt, 20.0),
    ]
    records = simulate_requests(config, reqs, profile=profile).records
    ttft = {
        k: 1000.0 * (r.first_token_time - r.arrival_time)
        for k, r in records.items()
        if r.first_token_time is not None
    }
    return {
        "prefix_len": prefix_len,
        "salted": salted,
        "right_guess_ttft_ms": ttft["right-guess"],
        "wrong_guess_ttft_ms": ttft["wrong-guess"],
        "right_guess_cached_tokens": records["right-guess"].num_cached_tokens,
        "gap_ms": ttft["wrong-guess"] - ttft["right-guess"],
    }


def probe_attack_table(
    config: EngineConfig, prefix_lens: list[int], *, profile: str | Path | None = None
) -> pd.DataFrame:
    """`probe_attack` for every prefix length, shared cache and salted."""
    rows = [
        probe_attack(config, n, salted=s, profile=profile)
        for s in (False, True)
        for n in prefix_lens
    ]
    return pd.DataFrame(rows)


@contextmanager
def tenant_workload(base: str = "system-prompt", tenants: int = 4) -> Iterator[str]:
    """A spec file: the shipped `base` spec with `tenants` salts (1 = everyone shares)."""
    spec = yaml.safe_load((workloads_dir() / f"{base}.yaml").read_text())
    spec["name"] = f"{base}-tenants"  # one name for every count: the same requests
    spec["tenants"] = {"count": tenants}
    with TemporaryDirectory(prefix="pagesim-tenants-") as tmp:
        path = Path(tmp) / f"{base}-tenants.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        yield str(path)


def hit_miss_records(metrics: MetricsCollector) -> pd.DataFrame:
    """Per completed request: prompt length, cached tokens, TTFT (ms), hit (cached > 0)."""
    rows = [
        {
            "num_prompt_tokens": r.num_prompt_tokens,
            "num_cached_tokens": r.num_cached_tokens,
            "ttft_ms": 1000.0 * (r.first_token_time - r.arrival_time),
            "cache_salt": r.cache_salt,
        }
        for r in metrics.records.values()
        if r.reject_reason is None and r.first_token_time is not None
    ]
    df = pd.DataFrame(rows)
    df["hit"] = df["num_cached_tokens"] > 0
    return df
