"""The real-time replay loop against the simulator's engine, on a fake clock.

With a clock that only moves when the runner works (a constant step time) or the loop sleeps,
the wall-clock replay must produce the simulator's per-request timeline exactly: same
arrivals, first-scheduled times, first and last token times, finish times, and the same result
keys. That pins the replay's semantics (arrival pick-up, idle waits, when tokens become
visible) to the simulator's, so a real run and a simulation differ only in step costs.
"""

from __future__ import annotations

import math

import pytest
import simpy

from pagesim.config import EngineConfig
from pagesim.gpu.serve import make_engine, replay, serve_result
from pagesim.metrics import MetricsCollector, summarize
from pagesim.sim.engine import ServingEngine
from pagesim.sim.runner import CostModelRunner
from pagesim.validate import build_requests

STEP_S = 0.0125


class _Cost:
    def step_time(self, batch) -> float:
        return STEP_S


class _FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, dt: float) -> None:
        self.t += dt


class _ClockedRunner:
    """The simulator's runner, but its step time passes on the fake clock."""

    def __init__(self, clock: _FakeClock, vocab: int) -> None:
        self.clock = clock
        self.inner = CostModelRunner(_Cost(), vocab_size=vocab)

    def execute_model(self, out):
        res = self.inner.execute_model(out)
        self.clock.t += res.step_time_s
        return res


def _config() -> EngineConfig:
    return EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
    )


def _simulate(config, requests):
    env = simpy.Environment()
    scheduler = make_engine(config, 200)
    metrics = MetricsCollector()
    engine = ServingEngine(
        env,
        scheduler,
        CostModelRunner(_Cost(), config.model_spec.vocab_size),
        metrics,
        lambda: (0.0, 0.0, 0.0, 0.0, 0.0),
    )

    def client(req):
        yield env.timeout(req.arrival_time)
        engine.add_request(req)

    for r in requests:
        env.process(client(r))
    env.run()
    return metrics


@pytest.mark.parametrize("rate", [math.inf, 40.0])
def test_replay_on_a_fake_clock_matches_the_simulator(rate: float) -> None:
    config = _config()
    kw = dict(random_input_len=40, random_output_len=12, random_range_ratio=0.5)
    real_reqs = build_requests(config, "random", 24, 7, rate, **kw)
    sim_reqs = build_requests(config, "random", 24, 7, rate, **kw)
    clock = _FakeClock()
    scheduler = make_engine(config, 200)
    run = replay(
        real_reqs,
        scheduler,
        _ClockedRunner(clock, config.model_spec.vocab_size),
        clock=clock,
        sleep=clock.sleep,
    )
    sim = _simulate(config, sim_reqs)
    assert run.metrics.records.keys() == sim.records.keys()
    for rid, want in sim.records.items():
        got = run.metrics.records[rid]
        for field in (
            "arrival_time",
            "first_scheduled_time",
            "first_token_time",
            "last_token_time",
            "finish_time",
        ):
            assert getattr(got, field) == pytest.approx(getattr(want, field), abs=1e-9), (
                f"{rid}.{field}"
            )
        assert got.num_output_tokens == want.num_output_tokens
    real, pred = summarize(run.metrics), summarize(sim)
    for key in ("request_throughput", "mean_ttft_ms", "p99_itl_ms", "mean_e2el_ms"):
        assert real[key] == pytest.approx(pred[key], rel=1e-9)
    full = serve_result(run, scheduler, config)
    assert full["num_gpu_blocks"] == 200 and full["completed"] == 24
    assert all(s.host_overhead_s == pytest.approx(0.0) for s in run.steps)
    if math.isfinite(rate):
        assert clock.t - 100.0 > 24 / rate  # idle waits were slept, not skipped


def test_wall_clock_limit_aborts_the_rest() -> None:
    config = _config()
    reqs = build_requests(config, "random", 10, 1, 1.0, random_input_len=40, random_output_len=12)
    clock = _FakeClock()
    run = replay(
        reqs,
        make_engine(config, 200),
        _ClockedRunner(clock, config.model_spec.vocab_size),
        clock=clock,
        sleep=clock.sleep,
        max_wall_s=3.5,
    )
    failed = [r for r in run.metrics.records.values() if r.reject_reason == "wall-clock limit"]
    assert len(run.metrics.records) == 10 and 5 <= len(failed) <= 8


@pytest.mark.slow
def test_warm_up_runs_eager_shapes_and_leaves_no_records() -> None:
    torch = pytest.importorskip("torch")
    from pagesim.gpu.runner import GPUModelRunner
    from pagesim.gpu.serve import warm_up

    cfg = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=32,
        max_num_batched_tokens=64,
        max_model_len=256,
    )
    runner = GPUModelRunner(cfg, 128, device="cpu", dtype=torch.float32)
    calls = []
    inner = runner.model.forward

    def forward(input_ids, *args, **kw):
        calls.append(int(input_ids.shape[0]))
        return inner(input_ids, *args, **kw)

    runner.model.forward = forward
    assert warm_up(runner, cfg) == 4
    assert calls == [64, 32, 64, 40]  # every shape ran, at its token count
    assert runner.step_records == []
    # a run served afterwards still starts from a clean scheduler
    sched = make_engine(cfg, 128)
    for r in build_requests(
        cfg, "random", 2, 0, math.inf, random_input_len=20, random_output_len=2
    ):
        sched.add_request(r)
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, runner.execute_model(out))
    assert len(runner.step_records) >= 2
