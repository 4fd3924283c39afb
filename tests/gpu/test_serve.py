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
from pagesim.sim.simulate import LoadSpec
from pagesim.validate.serve import build_requests

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
    real_reqs = build_requests(config, LoadSpec("random", 24, rate, seed=7, **kw))
    sim_reqs = build_requests(config, LoadSpec("random", 24, rate, seed=7, **kw))
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
    reqs = build_requests(
        config, LoadSpec("random", 10, 1.0, seed=1, random_input_len=40, random_output_len=12)
    )
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
    from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
    from pagesim.gpu.serve import warm_up

    cfg = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=32,
        max_num_batched_tokens=64,
        max_model_len=256,
    )
    runner = GPUModelRunner(cfg, 128, RunnerConfig(device="cpu", dtype=torch.float32))
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
        cfg, LoadSpec("random", 2, math.inf, random_input_len=20, random_output_len=2)
    ):
        sched.add_request(r)
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, runner.execute_model(out))
    assert len(runner.step_records) >= 2


def _multi_turn_config() -> EngineConfig:
    """llama-2-7b's shapes (4,096 tokens of context, as the multi-turn workload caps them);
    the fake-clock runner computes nothing."""
    return EngineConfig.create(
        model="llama-2-7b",
        block_size=16,
        max_num_seqs=16,
        max_num_batched_tokens=512,
        max_model_len=4096,
    )


def _simulate_sessions(config, plan, arrivals):
    """The simulator's own closed loop (`pagesim.sim.simulate`'s clients) over the engine."""
    from pagesim.sim.simulate import _Clients

    env = simpy.Environment()
    metrics = MetricsCollector()
    engine = ServingEngine(
        env,
        make_engine(config, 2000),
        CostModelRunner(_Cost(), config.model_spec.vocab_size),
        metrics,
        lambda: (0.0, 0.0, 0.0, 0.0, 0.0),
    )
    clients = _Clients(env, engine, plan, arrivals, None, None)
    env.run()
    assert clients.all_done
    return metrics


def test_multi_turn_sessions_are_closed_loop_in_wall_clock_time_as_in_the_simulator() -> None:
    """Turn k+1 of a session arrives when turn k finished plus its think time, on the replay's
    own clock; the replay and the simulator's clients send the same turns (ids, prompts with
    their histories, prefix hits) at the same times."""
    from pagesim.sim.arrivals import session_arrival_times
    from pagesim.validate.serve import build_traffic
    from pagesim.workload import load_workload
    from pagesim.workload.sessions import ClosedLoopSessions

    config = _multi_turn_config()
    # sessions at 2/s: several overlap (the fake clock makes the think times cost nothing)
    traffic = build_traffic(config, LoadSpec("multi-turn", 40, 2.0, seed=3))
    assert isinstance(traffic, ClosedLoopSessions) and traffic.num_sessions < 40
    clock = _FakeClock()
    run = replay(
        traffic,
        make_engine(config, 2000),
        _ClockedRunner(clock, config.model_spec.vocab_size),
        clock=clock,
        sleep=clock.sleep,
    )
    plan = load_workload("multi-turn").sample(40, seed=3, vocab_size=config.model_spec.vocab_size)
    sim = _simulate_sessions(config, plan, session_arrival_times(plan, 2.0, None, 3))
    got, want = run.metrics.records, sim.records
    assert list(got) == list(want) and len(got) == 40
    for rid, w in want.items():
        g = got[rid]
        assert (g.session_id, g.num_prompt_tokens, g.num_output_tokens, g.num_cached_tokens) == (
            w.session_id,
            w.num_prompt_tokens,
            w.num_output_tokens,
            w.num_cached_tokens,
        ), rid
        for name in ("arrival_time", "first_token_time", "finish_time"):
            assert getattr(g, name) == pytest.approx(getattr(w, name), abs=1e-9), (rid, name)
    # the closed loop itself: each later turn is sent its think time after the previous ended
    by_session: dict[str | None, list] = {}
    for rec in got.values():  # in arrival order
        by_session.setdefault(rec.session_id, []).append(rec)
    assert len(by_session) == plan.num_sessions
    checked = 0
    for s, recs in zip(range(plan.num_sessions), by_session.values(), strict=True):
        turns = list(plan.session(s).request_indices)
        assert len(recs) == len(turns)
        for k in range(1, len(turns)):
            prev, this = recs[k - 1], recs[k]
            think = float(plan.think_time_s[turns[k]])
            assert prev.finish_time is not None and think > 0
            assert this.arrival_time == pytest.approx(prev.finish_time + think, abs=1e-9)
            assert this.arrival_time > prev.finish_time
            assert this.num_cached_tokens > 0  # the history hit the prefix cache
            checked += 1
    assert checked == 40 - plan.num_sessions


def test_single_turn_build_requests_refuses_sessions() -> None:
    from pagesim.errors import WorkloadError

    with pytest.raises(WorkloadError, match="closed loop"):
        build_requests(_multi_turn_config(), LoadSpec("multi-turn", 10))


@pytest.mark.slow
def test_a_multi_turn_load_is_served_by_the_gpu_runner_and_validated(tmp_path) -> None:
    """`serve_workload` (the path of `pagesim validate --workload multi-turn`) with the tiny
    model in the interpreter: every turn is served, each later turn sent after the previous
    one finished, and the simulator's prediction of the stored run sends the same requests."""
    torch = pytest.importorskip("torch")
    from pathlib import Path

    from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
    from pagesim.validate.compare import simulate_like
    from pagesim.validate.serve import serve_workload
    from pagesim.validate.store import load_dict, read_real_run, save_real_run

    spec = Path(__file__).resolve().parents[1] / "fixtures" / "workloads" / "tiny-multi-turn.yaml"
    cfg = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        num_gpu_blocks_override=128,
    )
    model = RandomWeightDecoder(DecoderConfig(cfg.model_spec, torch.float32, "cpu", 16, seed=0))
    load = load_dict(str(spec), 6, 0, None)
    result, records = serve_workload(cfg, model, 128, load, device="cpu", cuda_graphs=False)
    assert result["completed"] == 6 and result["failed"] == 0
    real = records["requests"]
    turns: dict = {}
    for r in real:
        turns.setdefault(r["session_id"] or r["request_id"], []).append(r)
    assert any(len(t) > 1 for t in turns.values())
    for t in turns.values():
        for prev, this in zip(t, t[1:], strict=False):
            assert this["arrival_time"] > prev["finish_time"]
    path = save_real_run(
        tmp_path / "run.json", config=cfg, load=load, result=result, records=records, device={}
    )
    predicted = simulate_like(read_real_run(path), None).metrics.records
    key = ("request_id", "session_id", "num_prompt_tokens", "max_tokens")
    assert sorted(tuple(r[k] for k in key) for r in real) == sorted(
        tuple(getattr(r, k) for k in key) for r in predicted.values()
    )
