"""Tensor parallelism on CPUs: two processes over gloo, the tiny Llama split two ways.

One spawn of two ranks runs six checks (process start-up costs seconds, so they share it):

1. the sharded model equals the unsharded one: the same prefill then decode steps through
   `GPUModelRunner` with the TP shard and with the whole model give the same final hidden rows
   and the same `[S, vocab]` logits (fp32, summation order aside), on both ranks; each rank's
   KV cache holds its one KV head, and its weights are half the model plus the replicated norms;
2. the broadcast drives identical steps: rank 0 serves requests through the real scheduler
   (chunked prefill, several sequences) with `TPDriverRunner`, rank 1 runs `run_worker`; both
   record a digest of every executed step (requests, counts, block tables, input ids,
   positions, slot mapping) and the lists must be equal, step for step;
3. the all-reduce benchmark runs as a collective from inside the worker loop (tiny sizes);
4. `calibrate_tensor_parallel` runs its whole flow (grid through the broadcast, host overhead,
   all-reduce table) on a tiny grid and writes a TP-2 profile that loads back;
5. `serve_tp`, the real run of a TP engine, serves every request and keeps the runner's record
   of every step beside the serve loop's;
6. `graph_vs_eager_tp` runs steps through the padded graph path (uncaptured on a CPU) and
   eagerly, every rank switching together: a rank left in the other mode would all-reduce
   tensors of another row count, and the group would fail.

The encoder/decoder pair is also checked alone (no processes) across a changed block table,
a request id reused by a new request, and finished requests.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from pagesim.config import EngineConfig
from pagesim.cost.profile import Profile
from pagesim.errors import InternalError
from pagesim.gpu import tp_runner
from pagesim.gpu.allreduce_bench import bench_allreduce
from pagesim.gpu.calibrate import CalibrationGrid
from pagesim.gpu.model import DecoderConfig, RandomWeightDecoder
from pagesim.gpu.parallel import (
    MULTICAST_OFF_ENV,
    TPGroup,
    destroy_tensor_parallel,
    init_tensor_parallel,
    kv_head_range,
    launch,
    multicast_off_env,
    vocab_range,
)
from pagesim.gpu.runner import GPUModelRunner, RunnerConfig
from pagesim.gpu.serve import make_engine, replay
from pagesim.gpu.tp_model import TensorParallelDecoder
from pagesim.gpu.tp_profiler import calibrate_tensor_parallel, graph_vs_eager_tp, serve_tp
from pagesim.gpu.tp_runner import (
    Configure,
    LocalRunner,
    StepDecoder,
    StepEncoder,
    Stop,
    TPDriverRunner,
    UseGraphs,
    broadcast_stop,
    run_collective,
    run_worker,
)
from pagesim.request import Request
from pagesim.scheduler.output import ScheduledRequest, SchedulerOutput
from pagesim.specs import ModelSpec

TP = 2
SEED = 3


def _config() -> EngineConfig:
    return EngineConfig.create(
        model="tiny-llama",
        gpu="h200",
        block_size=16,
        max_num_seqs=3,
        max_num_batched_tokens=48,
        max_model_len=256,
    )


def _two_steps() -> list[SchedulerOutput]:
    """A prefill of two prompts (20 and 9 tokens), then one decode step of both."""
    a = Request("a", [(7 * i + 1) % 512 for i in range(20)], max_tokens=4)
    b = Request("b", [(11 * i + 5) % 512 for i in range(9)], max_tokens=4)
    s1 = SchedulerOutput(step_id=0, block_size=16, total_num_scheduled_tokens=29)
    s1.scheduled = [ScheduledRequest(a, 20, 0, [1, 2]), ScheduledRequest(b, 9, 0, [5])]
    s2 = SchedulerOutput(step_id=1, block_size=16, total_num_scheduled_tokens=2)
    s2.scheduled = [ScheduledRequest(a, 1, 20, [1, 2]), ScheduledRequest(b, 1, 9, [5])]
    return [s1, s2]


def _equivalence(group: TPGroup, tp_model: TensorParallelDecoder) -> dict:
    """Check 1: TP shard vs whole model on the same two steps (see the module docstring)."""
    config = _config()
    full = RandomWeightDecoder(DecoderConfig(config.model_spec, torch.float32, "cpu", 16, SEED))
    tp_runner = GPUModelRunner(
        config, 8, RunnerConfig(device="cpu", temperature=0.0), model=tp_model
    )
    full_runner = GPUModelRunner(config, 8, RunnerConfig(device="cpu", temperature=0.0), model=full)
    errors = []
    for out in _two_steps():
        got, want = tp_runner.execute_model(out), full_runner.execute_model(out)
        assert got.sampled_token_ids == want.sampled_token_ids
        h_tp, h_full = tp_runner.last_hidden, full_runner.last_hidden
        torch.testing.assert_close(h_tp, h_full, rtol=1e-5, atol=1e-5)
        logits_tp, logits_full = tp_model.compute_logits(h_tp), full.compute_logits(h_full)
        assert logits_tp.shape == logits_full.shape == (2, 512)
        torch.testing.assert_close(logits_tp, logits_full, rtol=1e-5, atol=1e-5)
        errors.append(float((logits_tp - logits_full).abs().max()))
        for sr in out.scheduled:  # the runner's sampled token, as the scheduler would append
            sr.request.output_token_ids.append(got.sampled_token_ids[sr.request_id])
    norms = (
        sum(
            t.numel() * 4 for layer in full.layers for k, t in layer.items() if k.startswith("norm")
        )
        + full.final_norm[0].numel() * 4
    )
    return {
        "max_logit_error": max(errors),
        "kv_heads": tp_runner.kv_caches[0][0].shape[2],
        "shard_bytes": tp_model.weight_bytes,
        "full_bytes": full.weight_bytes,
        "norm_bytes": norms,
    }


def step_digest(out: SchedulerOutput, runner: GPUModelRunner) -> str:
    """A hash of what a rank executed: the step's requests, counts and block tables, and the
    runner's input ids, positions, slot mapping and block table. Equal on every rank iff the
    ranks ran identical steps."""
    entries = [
        (s.request_id, s.num_new_tokens, s.num_computed_tokens, s.block_ids, s.new_block_ids)
        for s in out.scheduled
    ]
    h = hashlib.blake2b(repr((out.step_id, entries)).encode(), digest_size=16)
    inputs = runner.last_inputs
    if out.scheduled and inputs is not None:
        md = inputs.metadata
        for t in (inputs.input_ids, inputs.positions, md.slot_mapping, md.block_table):
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


@contextmanager
def step_digests() -> Iterator[list[str]]:
    """The `step_digest` of every step this process's runners execute inside the block."""
    digests: list[str] = []
    execute = GPUModelRunner.execute_model

    def recording(runner: GPUModelRunner, out: SchedulerOutput):
        result = execute(runner, out)
        digests.append(step_digest(out, runner))
        return result

    GPUModelRunner.execute_model = recording  # type: ignore[method-assign]
    try:
        yield digests
    finally:
        GPUModelRunner.execute_model = execute  # type: ignore[method-assign]


def _serve(group: TPGroup, tp_model: TensorParallelDecoder) -> dict:
    """Checks 2 and 3 on rank 0: serve through the broadcast, then benchmark all-reduce."""
    config = _config()
    prompts = [[(13 * i + k) % 512 for i in range(n)] for k, n in enumerate((30, 17, 40))]
    requests = [Request(f"r{k}", p, max_tokens=3 + k) for k, p in enumerate(prompts)]
    with step_digests() as digests:
        driver = TPDriverRunner(
            group, config, 40, RunnerConfig(seed=SEED, cuda_graphs=False), model=tp_model
        )
        run = replay(requests, make_engine(config, 40), driver, disable_gc=False)
    rows = run_collective(
        group, bench_allreduce, (64, 4096), dtype=torch.float32, warmup=1, repeats=3, inner=2
    )
    broadcast_stop(group)
    finished = sum(r.finish_time is not None for r in run.metrics.records.values())
    return {
        "digests": digests,
        "finished": finished,
        "rows": [[r.tp, r.message_bytes, r.time_us, r.time_p10_us, r.time_p90_us] for r in rows],
    }


def _calibrate(group: TPGroup, tp_model: TensorParallelDecoder, out_dir: str) -> dict:
    """Check 4 (every rank calls it; rank 0 reports)."""
    config = EngineConfig.create(
        model="tiny-llama",
        block_size=16,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=96,
        num_gpu_blocks_override=64,
    )
    grid = CalibrationGrid(
        block_sizes=(16,),
        full_block_sizes=(16,),
        decode_batches=(2,),
        decode_contexts=(16, 32),  # two points: a profile on disk measures a grid
        prefill_tokens=(16,),
        prefill_cached=(0,),
        mixed=(),
        overhead_max_reqs=2,
        repeats=1,
        min_repeats=1,
    )
    result = calibrate_tensor_parallel(
        group,
        tp_model,
        config,
        grid,
        seed=SEED,
        calibration_root=out_dir,
        log=lambda _: None,
        allreduce_bytes=(256,),
        allreduce_repeats=2,
    )
    if result is None:
        return {}
    loaded = Profile.load(result.directory)
    return {
        "profile_dir": Path(result.directory).relative_to(out_dir).as_posix(),
        "profile_equal": loaded == result.profile,
        "profile_tp": loaded.metadata.tensor_parallel_size,
        "in_steps": loaded.metadata.allreduce_in_step_times,
        "rows": {
            k: len(getattr(loaded, k)) for k in ("decode", "prefill", "overhead", "allreduce")
        },
        "allreduce_tp": [r.tp for r in loaded.allreduce],
    }


def _serve_tp(group: TPGroup, tp_model: TensorParallelDecoder) -> dict:
    """Check 5 (every rank calls it; rank 0 reports)."""
    config = _config()
    requests = None
    if group.is_driver:
        requests = [
            Request(
                f"s{k}", [(7 * i + k) % 512 for i in range(n)], max_tokens=3, arrival_time=0.01 * k
            )
            for k, n in enumerate((20, 33))
        ]
    # graphs asked for: a CPU runs their padded static-buffer path uncaptured, and every rank
    # gets and handles the capture message (a worker that did not would stop on it)
    served = serve_tp(group, tp_model, config, 40, requests, seed=SEED, cuda_graphs=True)
    if served is None:
        return {}
    result, records = served
    return {
        "completed": result["completed"],
        "truncated": result["truncated"],
        "graphs": [result["gpu_cuda_graphs"], result["gpu_graphs_captured"]],
        "loop_steps": len(records["steps"]["start_s"]),
        "runner_steps": len(records["runner_steps"]["wall_s"]),
    }


def _rank_main(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    group = init_tensor_parallel(rank, world_size, init_method, timeout_s=120.0)
    try:
        spec = ModelSpec.from_name("tiny-llama")
        tp_model = TensorParallelDecoder(
            DecoderConfig(spec, torch.float32, "cpu", 16, seed=SEED), group
        )
        facts = _equivalence(group, tp_model)
        facts["env"] = {k: os.environ.get(k) for k in MULTICAST_OFF_ENV}
        if group.is_driver:
            facts.update(_serve(group, tp_model))
        else:
            with step_digests() as digests:
                report = run_worker(group, tp_model, seed=SEED)
            facts.update(digests=digests, configures=report.num_configures)
        facts["calibration"] = _calibrate(group, tp_model, out_dir)
        facts["serve_tp"] = _serve_tp(group, tp_model)
        shapes = {"decode 3x40": [(40, 1)] * 3, "chunk with decodes": [(40, 1)] * 2 + [(0, 24)]}
        facts["graph_check"] = graph_vs_eager_tp(
            group, tp_model, _config(), 40, shapes, reps=2, seed=SEED
        )
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(facts))
    finally:
        destroy_tensor_parallel()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tp")
    launch(_rank_main, TP, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(TP)]


@pytest.mark.slow
def test_sharded_model_equals_the_whole_model(ranks):
    for facts in ranks:
        assert facts["max_logit_error"] < 1e-5
        assert facts["kv_heads"] == 1  # tiny-llama: 2 KV heads over 2 ranks
        assert 2 * facts["shard_bytes"] == facts["full_bytes"] + facts["norm_bytes"]


@pytest.mark.slow
def test_broadcast_drives_identical_steps_on_both_ranks(ranks):
    driver, worker = ranks
    assert driver["finished"] == 3
    assert worker["configures"] == 1
    assert len(driver["digests"]) >= 5  # chunked prefills and decodes of three requests
    assert worker["digests"] == driver["digests"]


@pytest.mark.slow
def test_allreduce_bench_runs_on_gloo(ranks):
    rows = ranks[0]["rows"]
    assert [r[:2] for r in rows] == [[2, 64], [2, 4096]]
    for _, _, median, p10, p90 in rows:
        assert 0 < p10 <= median <= p90


@pytest.mark.slow
def test_tp_calibration_dry_run_writes_a_tp2_profile(ranks):
    cal = ranks[0]["calibration"]
    assert cal["profile_dir"] == "cpu/tiny-llama-tp2" and cal["profile_equal"]
    assert cal["profile_tp"] == 2 and cal["in_steps"] is True
    assert cal["rows"]["decode"] == 2 and cal["rows"]["prefill"] == 1
    assert cal["allreduce_tp"] == [2]
    assert ranks[1]["calibration"] == {}


@pytest.mark.slow
def test_every_rank_runs_with_multicast_off(ranks):
    for facts in ranks:
        assert facts["env"] == dict(MULTICAST_OFF_ENV)
    env = multicast_off_env({"PATH": "/bin", "NCCL_NVLS_ENABLE": "1"})
    assert env == {"PATH": "/bin", **MULTICAST_OFF_ENV}


# ---- no processes ------------------------------------------------------------------------
def test_encoder_and_decoder_keep_workers_in_step():
    enc, dec = StepEncoder(), StepDecoder()
    a = Request("a", list(range(40)), max_tokens=5)

    def step(i: int, entries, finished=()) -> SchedulerOutput:
        out = SchedulerOutput(step_id=i, block_size=16, finished_req_ids=list(finished))
        out.scheduled = [ScheduledRequest(r, n, c, b, new) for r, n, c, b, new in entries]
        out.total_num_scheduled_tokens = sum(e[1] for e in entries)
        return out

    def same(out: SchedulerOutput) -> None:
        got = dec.decode(enc.encode(out))
        assert [
            (
                s.request_id,
                s.num_new_tokens,
                s.num_computed_tokens,
                s.block_ids,
                s.new_block_ids,
                s.request.prompt_token_ids,
                s.request.output_token_ids,
            )
            for s in got.scheduled
        ] == [
            (
                s.request_id,
                s.num_new_tokens,
                s.num_computed_tokens,
                s.block_ids,
                s.new_block_ids,
                s.request.prompt_token_ids,
                s.request.output_token_ids,
            )
            for s in out.scheduled
        ]

    same(step(0, [(a, 32, 0, [4, 9], ())]))
    same(step(1, [(a, 8, 32, None, [2])]))
    a.output_token_ids.append(17)
    msg = enc.encode(step(2, [(a, 1, 40, None, [])]))
    assert msg.new_requests == [] and msg.entries[0].new_output == [17]
    assert msg.entries[0].block_ids is None and msg.entries[0].new_block_ids == []
    dec.decode(msg)
    same(step(3, [(a, 41, 0, [7, 3, 6], ())]))  # preempted and recomputed: a new block table
    b = Request("a", list(range(5)), max_tokens=1)  # the id reused by another request
    same(step(4, [(b, 5, 0, [8], ())]))
    msg = enc.encode(step(5, [(a, 1, 41, None, [])]))  # interleaved again: nothing resent
    assert msg.new_requests == [] and msg.entries[0].new_block_ids == []
    assert msg.entries[0].new_output == [] and msg.entries[0].keep_output == 1
    dec.decode(msg)
    dec.decode(enc.encode(step(6, [], finished=["a"])))  # the latest "a" finished
    assert [r.prompt_token_ids for r in dec.requests.values()] == [list(range(5))]


class _Messages:
    """A worker's view of a group: `broadcast_object` hands out rank 0's messages in turn."""

    is_driver = False

    def __init__(self, messages: list) -> None:
        self.messages = list(messages)

    def broadcast_object(self, _obj):
        return self.messages.pop(0)


def test_a_new_configure_frees_the_old_kv_cache_graphs_set_aside_included(monkeypatch):
    # one rank's KV cache is most of a GPU: the old one must be gone before the next is made
    model = RandomWeightDecoder(
        DecoderConfig(ModelSpec.from_name("tiny-llama"), torch.float32, "cpu", 16, seed=SEED)
    )
    caches: list[weakref.ref] = []
    alive_at_build: list[list[bool]] = []

    def build(*args, **kwargs):  # what a rank still holds when the next runner is built
        alive_at_build.append([c() is not None for c in caches])
        runner = GPUModelRunner(*args, **kwargs)
        caches.append(weakref.ref(runner.kv_caches[0][0]))
        return runner

    monkeypatch.setattr(tp_runner, "GPUModelRunner", build)
    msg = Configure(_config(), 40, cuda_graphs=True)
    slot = LocalRunner()
    with pytest.raises(InternalError, match="before any Configure"):
        slot.use_graphs(False)
    first = slot.configure(msg, model, SEED)
    graphs = first.graphs
    assert graphs is not None and not graphs.capture  # a CPU: the padded path, uncaptured
    slot.use_graphs(False)
    assert first.graphs is None and slot.graphs is graphs  # set aside, holding the cache
    slot.use_graphs(True)
    assert first.graphs is graphs
    slot.use_graphs(False)
    del first, graphs
    second = slot.configure(msg, model, SEED)
    assert second.graphs is slot.graphs is not None
    del second, slot  # the worker below starts from nothing
    # the worker loop: graphs set aside when the next Configure arrives
    report = run_worker(
        _Messages([msg, UseGraphs(False), msg, UseGraphs(True), Stop()]), model, seed=SEED
    )
    assert report.num_configures == 2
    assert alive_at_build == [[], [False], [False, False], [False, False, False]]


def test_sharding_ranges():
    assert [kv_head_range(8, r, 4) for r in range(4)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [kv_head_range(2, r, 8) for r in range(8)] == [(0, 1)] * 4 + [(1, 2)] * 4
    assert [vocab_range(10, r, 4) for r in range(4)] == [
        (0, 3, 3),
        (3, 6, 3),
        (6, 9, 3),
        (9, 10, 3),
    ]
    with pytest.raises(Exception, match="tensor_parallel_size=3: must divide num_kv_heads=8"):
        kv_head_range(8, 0, 3)


@pytest.mark.slow
def test_serve_tp_keeps_the_runners_record_of_every_step(ranks):
    served = ranks[0]["serve_tp"]
    assert served["completed"] == 2 and served["truncated"] is False
    assert served["runner_steps"] == served["loop_steps"] >= 3
    assert served["graphs"] == [False, 0]  # asked for, but a CPU captures none
    assert ranks[1]["serve_tp"] == {}


@pytest.mark.slow
def test_graph_check_switches_every_rank_together(ranks):
    rows = ranks[0]["graph_check"]
    assert [r["shape"] for r in rows] == ["decode 3x40", "chunk with decodes"]
    for r in rows:
        assert r["hidden_rel_diff"] < 1e-5 and r["graph_failed"] is None
    assert ranks[1]["graph_check"] is None
