"""KV capacity measured on the GPU, as vLLM v1's worker measures it at start-up.

vLLM (`gpu_worker.determine_available_memory`): load the weights, run one profiling step of
the largest batch (`max_num_batched_tokens` tokens over `min(max_num_seqs, tokens)` requests,
attention skipped since no KV cache exists yet, plus a sampler run over those requests), then

    non_kv       = weights + torch peak increase of the profile step + non-torch increase
    available_kv = total GPU memory * gpu_memory_utilization - non_kv
    num_blocks   = available_kv // page_size_bytes      (one block, all layers, K and V)

`measure_kv_capacity` does exactly that with the random-weight model and reports it next to
`pagesim.kvcache.sizing`'s prediction (which estimates the same three terms without a GPU), so
the estimate's error is a measured number, not a guess.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from pagesim.config import EngineConfig
from pagesim.gpu.model import RandomWeightDecoder
from pagesim.kvcache import sizing
from pagesim.specs import GiB


@dataclass(frozen=True)
class MeasuredKVCapacity:
    """Measured memory terms (bytes) and the KV cache they leave, beside sizing's estimate."""

    total_memory_bytes: int  # torch.cuda.mem_get_info()[1]
    gpu_memory_utilization: float
    weights_bytes: int
    activation_peak_bytes: int  # torch peak increase during the profile step
    non_torch_bytes: int  # CUDA memory outside torch's allocator gained since start
    available_kv_bytes: int
    page_size_bytes: dict[int, int]  # block size -> bytes of one block, all layers
    num_gpu_blocks: dict[int, int]  # block size -> measured blocks
    predicted_num_gpu_blocks: dict[int, int]  # block size -> sizing's estimate
    predicted_available_kv_bytes: int
    profile_tokens: int
    profile_reqs: int

    def error_pct(self, block_size: int) -> float:
        """(predicted - measured) / measured blocks, in %."""
        m = self.num_gpu_blocks[block_size]
        return 100.0 * (self.predicted_num_gpu_blocks[block_size] - m) / m

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for key in ("page_size_bytes", "num_gpu_blocks", "predicted_num_gpu_blocks"):
            d[key] = {str(k): v for k, v in d[key].items()}
        d["error_pct"] = {str(b): self.error_pct(b) for b in self.num_gpu_blocks}
        return d

    def report(self) -> str:
        lines = [
            f"total GPU memory {self.total_memory_bytes / GiB:.2f} GiB, utilization "
            f"{self.gpu_memory_utilization}",
            f"weights {self.weights_bytes / GiB:.2f} GiB, activation peak "
            f"{self.activation_peak_bytes / GiB:.2f} GiB, non-torch "
            f"{self.non_torch_bytes / GiB:.2f} GiB",
            f"available KV cache memory: {self.available_kv_bytes / GiB:.2f} GiB measured, "
            f"{self.predicted_available_kv_bytes / GiB:.2f} GiB predicted",
        ]
        for bs in sorted(self.num_gpu_blocks):
            lines.append(
                f"block_size {bs}: {self.num_gpu_blocks[bs]:,} blocks measured, "
                f"{self.predicted_num_gpu_blocks[bs]:,} predicted "
                f"({self.error_pct(bs):+.2f}%)"
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class MemorySnapshot:
    """Device memory at one instant (bytes)."""

    free: int
    total: int
    torch_allocated: int
    torch_reserved: int

    @property
    def non_torch(self) -> int:
        return (self.total - self.free) - self.torch_reserved

    @classmethod
    def take(cls, device: torch.device) -> MemorySnapshot:
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return cls(
            int(free),
            int(total),
            int(torch.cuda.memory_allocated(device)),
            int(torch.cuda.memory_reserved(device)),
        )


def profile_step(model: RandomWeightDecoder, num_tokens: int, num_reqs: int) -> None:
    """vLLM's dummy profile run: `num_tokens` tokens over `num_reqs` requests, no attention,
    then the LM head and the sampler over one row per request."""
    device = model.device
    per = [
        num_tokens // num_reqs + (1 if i < num_tokens % num_reqs else 0) for i in range(num_reqs)
    ]
    positions = torch.cat([torch.arange(n, device=device) for n in per])
    input_ids = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    ends = torch.tensor(per, device=device).cumsum(0) - 1
    hidden = model.forward(input_ids, positions, None, None, ends, skip_attention=True)
    model.sample(model.compute_logits(hidden))


def release_cached(device: torch.device | None = None) -> None:
    """Hand the caching allocator's unused blocks back to the GPU, so that the next runner's
    KV cache (most of a GPU) can take them; a no-op on a CPU. Without `device`, whenever CUDA
    is there."""
    if torch.cuda.is_available() if device is None else device.type == "cuda":
        torch.cuda.empty_cache()


def page_sizes(config: EngineConfig, block_sizes: tuple[int, ...]) -> dict[int, int]:
    """Block size -> bytes of one KV block of `config`'s model (all layers, K and V), as the
    KV cache manager that serves `config` lays it out."""
    hybrid = sizing.serves_hybrid(config)
    return {
        bs: sizing.page_size_bytes(
            config.model_spec,
            bs,
            config.kv_cache_dtype,
            config.tensor_parallel_size,
            hybrid_kv_cache_manager=hybrid,
        )
        for bs in block_sizes
    }


def measure_kv_capacity(
    config: EngineConfig,
    model: RandomWeightDecoder,
    before_weights: MemorySnapshot,
    block_sizes: tuple[int, ...] = (8, 16, 32, 64, 128),
) -> MeasuredKVCapacity:
    """Measure non-KV memory as vLLM does and size the KV cache for each block size.

    `before_weights` is the snapshot taken before `model` was built (vLLM's init snapshot), so
    the weights and any non-torch memory since then are counted.
    """
    device = model.device
    torch.cuda.empty_cache()
    after_weights = MemorySnapshot.take(device)
    weights = after_weights.torch_allocated - before_weights.torch_allocated
    torch.cuda.reset_peak_memory_stats(device)
    tokens = config.max_num_batched_tokens
    reqs = min(config.max_num_seqs, tokens)
    profile_step(model, tokens, reqs)
    torch.cuda.synchronize(device)
    peak = int(torch.cuda.max_memory_allocated(device)) - after_weights.torch_allocated
    after = MemorySnapshot.take(device)
    non_torch = max(0, after.non_torch - before_weights.non_torch)
    torch.cuda.empty_cache()
    total = after.total
    requested = math.ceil(total * config.gpu_memory_utilization)
    available = requested - (weights + peak + non_torch)
    pages = page_sizes(config, block_sizes)
    blocks = {bs: max(0, available // pages[bs]) for bs in block_sizes}
    predicted = {}
    predicted_available = 0
    for bs in block_sizes:
        cap = sizing.kv_capacity(
            config.replace(block_size=bs, num_gpu_blocks_override=None, kv_cache_memory_bytes=None)
        )
        predicted[bs] = cap.num_gpu_blocks
        predicted_available = cap.available_kv_cache_memory_bytes
    return MeasuredKVCapacity(
        total_memory_bytes=total,
        gpu_memory_utilization=config.gpu_memory_utilization,
        weights_bytes=weights,
        activation_peak_bytes=peak,
        non_torch_bytes=non_torch,
        available_kv_bytes=available,
        page_size_bytes=pages,
        num_gpu_blocks=blocks,
        predicted_num_gpu_blocks=predicted,
        predicted_available_kv_bytes=predicted_available,
        profile_tokens=tokens,
        profile_reqs=reqs,
    )
