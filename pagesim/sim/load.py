"""The traffic side of a run: `LoadSpec` (vllm bench serve's names) and the requests and
arrival times it draws. Apart from the simulation so that the GPU's real runs, on a machine
without SimPy, draw the same traffic."""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.errors import ConfigError
from pagesim.sim.arrivals import check_span, session_arrival_times
from pagesim.utils import MAX_COUNT, MAX_TOKENS, check_number
from pagesim.workload import WORKLOAD_PARAMS, load_workload


@dataclass(frozen=True)
class LoadSpec:
    """The traffic side of a run, with `vllm bench serve`'s names."""

    workload: str = "chat"
    num_prompts: int = 1000
    request_rate: float | None = None  # req/s; None: the workload's own arrivals; inf: all at 0
    burstiness: float = 1.0  # gamma shape of inter-arrival gaps (1 = Poisson)
    max_concurrency: int | None = None  # in-flight request cap, as vllm bench's semaphore
    seed: int = 0
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    random_prefix_len: int | None = None
    time_scale: float | None = None  # trace replay: multiply trace timestamps by this
    percentiles: tuple[float, ...] = (99,)
    goodput_slos_ms: tuple[tuple[str, float], ...] = ()  # (("ttft", 500.0), ...)

    def __post_init__(self) -> None:
        check_number("num_prompts", self.num_prompts, integer=True, high=MAX_COUNT)
        if self.request_rate is not None:
            check_number("request_rate", self.request_rate, allow_inf=True)
        check_number("burstiness", self.burstiness, low=1e-3, high=1e3)
        if self.max_concurrency is not None:
            check_number("max_concurrency", self.max_concurrency, integer=True)
        check_number("seed", self.seed, integer=True, low=0)
        for name in ("random_input_len", "random_output_len", "random_prefix_len"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), integer=True, high=MAX_TOKENS)
        if self.random_range_ratio is not None:
            check_number("random_range_ratio", self.random_range_ratio)
        if self.time_scale is not None:
            check_number("time_scale", self.time_scale, low=0, low_open=True)
        for key, ms in self.goodput_slos_ms:
            check_number(f"goodput {key}", ms, low=0, low_open=True)
        for p in self.percentiles:
            check_number("metric percentile", p)
        if self.num_prompts < 1:
            raise ConfigError(f"num_prompts={self.num_prompts}: must be >= 1")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ConfigError(f"request_rate={self.request_rate}: must be > 0 (or inf)")
        if self.request_rate is not None:
            n = self.num_prompts
            check_span("request_rate", self.request_rate, n, f"num_prompts={n}", ConfigError)
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency={self.max_concurrency}: must be >= 1")
        for p in self.percentiles:
            if not 0 < p < 100:
                raise ConfigError(f"metric percentile {p}: must be in (0, 100)")


def sample_traffic(load: LoadSpec, vocab_size: int):
    """The workload's request plan for `load` and each session's arrival time (seconds)."""
    params = {name: getattr(load, name) for name in WORKLOAD_PARAMS}
    workload = load_workload(load.workload, **params)
    plan = workload.sample(load.num_prompts, seed=load.seed, vocab_size=vocab_size)
    return plan, session_arrival_times(plan, load.request_rate, load.burstiness, load.seed)
