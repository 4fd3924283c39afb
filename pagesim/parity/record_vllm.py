"""Record a decision log from vLLM's own v1 Scheduler and KVCacheManager (CPU, fake outputs).

Needs vLLM importable (tested with 0.33.0 and 0.23.0; see docs/parity.md for the install);
nothing else in pagesim imports this module. The model is a config-only tiny Llama: no
weights, no tokenizer; the KV cache is one full-attention group of `num_gpu_blocks` blocks
(block 0 is vLLM's null block), or the workload's hybrid layout (`kv_cache_groups`: full and
sliding-window groups over those blocks, served by vLLM's HybridKVCacheCoordinator). Token ids come
from the workload; outputs from `synthetic_token`, so vLLM and pagesim hash the same sequences.

    python -m pagesim.parity.record_vllm tests/parity/golden [CASE ...]
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pagesim.parity.replay import StepObservation, replay
from pagesim.parity.workloads import (
    CASES,
    ParityRequest,
    ParityWorkload,
    case_workload,
    golden_name,
)
from pagesim.scheduler.output import synthetic_token


def _kwargs(fn: Any, **candidates: Any) -> dict[str, Any]:
    """Keep only the keyword arguments that this vLLM release's `fn` accepts."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params}


def _force_cpu_platform(platforms: Any) -> None:
    """0.33 picks the CPU platform from VLLM_TARGET_DEVICE; 0.23 only from a "+cpu" version
    string, so a stock wheel resolves to UnspecifiedPlatform: install CpuPlatform by hand."""
    from vllm.platforms.interface import UnspecifiedPlatform

    if isinstance(platforms.current_platform, UnspecifiedPlatform):
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


class VllmEngine:
    """vLLM's Scheduler wrapped as a `replay.EngineAdapter`."""

    def __init__(self, engine: dict[str, Any], workdir: str) -> None:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        import vllm
        import vllm.platforms

        _force_cpu_platform(vllm.platforms)
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.structured_output import StructuredOutputManager

        self.version = vllm.__version__
        bs, n_blocks = engine["block_size"], engine["num_gpu_blocks"]
        max_len = engine["max_model_len"]
        model_dir = Path(workdir) / "tiny-llama"
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.json").write_text(
            json.dumps(
                {
                    "architectures": ["LlamaForCausalLM"],
                    "model_type": "llama",
                    "hidden_size": 64,
                    "intermediate_size": 128,
                    "num_hidden_layers": 2,
                    "num_attention_heads": 4,
                    "num_key_value_heads": 2,
                    "vocab_size": 32000,
                    "max_position_embeddings": max_len,
                    "rms_norm_eps": 1e-5,
                    "torch_dtype": "float16",
                }
            )
        )
        model_config = ModelConfig(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="float16",
            max_model_len=max_len,
            seed=0,
        )
        sched_kwargs = dict(
            max_num_seqs=engine["max_num_seqs"],
            max_num_batched_tokens=engine["max_num_batched_tokens"],
            max_model_len=max_len,
            enable_chunked_prefill=engine["enable_chunked_prefill"],
            long_prefill_token_threshold=engine["long_prefill_token_threshold"],
            policy=engine["scheduling_policy"],
            is_encoder_decoder=False,
            async_scheduling=False,
            scheduler_reserve_full_isl=engine.get("scheduler_reserve_full_isl", True),
        )
        sched_config = SchedulerConfig(**_kwargs(SchedulerConfig, **sched_kwargs))
        cache_config = CacheConfig(
            block_size=bs,
            num_gpu_blocks_override=n_blocks,
            enable_prefix_caching=engine["enable_prefix_caching"],
        )
        vc = VllmConfig(
            model_config=model_config, scheduler_config=sched_config, cache_config=cache_config
        )
        vc.cache_config.num_gpu_blocks = n_blocks
        # One group per entry of the workload's hybrid layout (default: one full-attention
        # group); a group is one layer, since only the block management is replayed.
        page = {"block_size": bs, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
        groups = []
        for i, group in enumerate(engine.get("kv_cache_groups", [["full"]])):
            spec = (
                FullAttentionSpec(**page)
                if group[0] == "full"
                else SlidingWindowSpec(**page, sliding_window=group[1])
            )
            groups.append(KVCacheGroupSpec([f"layer{i}"], spec))
        self._hybrid = len(groups) > 1
        kv_config = KVCacheConfig(num_blocks=n_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
        self.scheduler = Scheduler(
            **_kwargs(
                Scheduler.__init__,
                vllm_config=vc,
                kv_cache_config=kv_config,
                structured_output_manager=StructuredOutputManager(vc),
                block_size=bs,
                hash_block_size=bs,
                log_stats=False,
            )
        )
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(bs, sha256)
        self._pool = self.scheduler.kv_cache_manager.block_pool
        self._preempt_order: list[str] = []
        original = self.scheduler._preempt_request

        def _logged_preempt(request: Any, *args: Any, **kwargs: Any) -> None:
            self._preempt_order.append(request.request_id)
            original(request, *args, **kwargs)

        self.scheduler._preempt_request = _logged_preempt  # observe the victim order only
        self._evicted: list[int] = []
        evict = self._pool._maybe_evict_cached_block

        def _logged_evict(block: Any) -> bool:
            evicted = evict(block)
            if evicted:
                self._evicted.append(block.block_id)
            return evicted

        self._pool._maybe_evict_cached_block = _logged_evict  # observe evictions only
        self.settings = {
            "max_num_batched_tokens": sched_config.max_num_batched_tokens,
            "max_num_seqs": sched_config.max_num_seqs,
            "scheduler_reserve_full_isl": getattr(sched_config, "scheduler_reserve_full_isl", None),
            "enable_chunked_prefill": sched_config.enable_chunked_prefill,
            "policy": str(sched_config.policy),
        }

    def add_request(
        self, request: ParityRequest, prompt_token_ids: list[int], arrival_step: int
    ) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True)
        req = Request(
            request_id=request.request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            cache_salt=request.cache_salt,
            block_hasher=self._hasher,
            arrival_time=float(arrival_step),
            priority=request.priority,
        )
        self.scheduler.add_request(req)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def free_queue(self) -> list[int]:
        q = self._pool.free_block_queue
        out: list[int] = []
        block = q.fake_free_list_head.next_free_block
        while block is not None and block is not q.fake_free_list_tail:
            out.append(block.block_id)
            block = block.next_free_block
        return out

    def step(self) -> StepObservation:
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import RequestStatus

        s = self.scheduler
        admitting = {r.request_id for r in s.waiting} | {
            r.request_id for r in getattr(s, "kv_holding_waiting", ())
        }
        self._preempt_order.clear()
        self._evicted.clear()
        so = s.schedule()
        scheduled = list(so.num_scheduled_tokens.items())
        hits = [
            (rid, s.requests[rid].num_computed_tokens - n)
            for rid, n in scheduled
            if rid in admitting
        ]
        tables: dict[str, list[int] | tuple[list[int], ...]] = {}
        for rid, _ in scheduled:
            rows = s.kv_cache_manager.get_block_ids(rid)
            tables[rid] = tuple(list(r) for r in rows) if self._hybrid else list(rows[0])
        preempted = list(self._preempt_order)
        ids = [rid for rid, _ in scheduled]
        sampled = []
        for rid in ids:
            req = s.requests[rid]
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([_next_token(req)] if done else [])
        out = ModelRunnerOutput(
            **_kwargs(
                ModelRunnerOutput,
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled,
                logprobs=None,
                prompt_logprobs_dict={},
                pooler_output=[],
            )
        )
        s.update_from_output(so, out)
        finished = [
            rid
            for rid in ids
            if rid not in s.requests or RequestStatus.is_finished(s.requests[rid].status)
        ]
        return StepObservation(
            scheduled=scheduled,
            hits=hits,
            preempted=preempted,
            block_tables=tables,
            finished=finished,
            evicted=list(self._evicted),
            free_queue=self.free_queue(),
        )


def _next_token(req: Any) -> int:
    """The next output token: `synthetic_token(request, index)`, as pagesim's runners emit;
    it reads only `prompt_token_ids`, which vLLM's `Request` has too."""
    return synthetic_token(req, req.num_output_tokens)


def record(workload: ParityWorkload, vllm_compat: str = "0.33"):
    """Replay `workload` through vLLM's Scheduler and return the `DecisionLog`."""
    with tempfile.TemporaryDirectory() as tmp:
        eng = VllmEngine(workload.engine, tmp)
        recorded_with = {"engine": "vllm", "version": eng.version, "settings": eng.settings}
        return replay(workload, eng, recorded_with, vllm_compat=vllm_compat)


def main(argv: list[str] | None = None) -> int:
    """`record_vllm OUT_DIR [CASE ...]`: write one golden file per case (default: all)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or any(c not in CASES for c in argv[1:]):
        print(f"usage: record_vllm OUT_DIR [{' '.join(CASES)}]", file=sys.stderr)
        return 2
    import vllm

    compat = ".".join(vllm.__version__.split(".")[:2])
    for case in argv[1:] or list(CASES):
        t0 = time.perf_counter()
        log = record(case_workload(case), vllm_compat=compat)
        path = log.write(Path(argv[0]) / golden_name(case, vllm.__version__))
        print(
            f"{path} ({path.stat().st_size} B, {time.perf_counter() - t0:.1f} s): "
            f"{json.dumps(log.summary())}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
