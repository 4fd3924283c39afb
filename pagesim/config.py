"""Engine configuration with vLLM's names and defaults.

`EngineConfig` is frozen and validated in `__post_init__`; a bad value raises `ConfigError` with
one line naming the field. Defaults that vLLM resolves from the hardware (`max_num_seqs`,
`max_num_batched_tokens`) or the model (`max_model_len`) are resolved by `EngineConfig.create`,
so a config always holds concrete numbers. Building a config writes nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pagesim.errors import ConfigError
from pagesim.specs import GiB, GPUSpec, ModelSpec
from pagesim.utils import MAX_BLOCKS, MAX_TOKENS, check_number

MAX_SWAP_SPACE_GIB = float(1 << 20)  # 1 PiB of host memory per GPU
MAX_TENSOR_PARALLEL_SIZE = 1024
MAX_BLOCK_SIZE = 1 << 16

ALLOCATORS: tuple[str, ...] = ("paged", "reserve-max", "pow2", "oracle")
PLACEMENTS: tuple[str, ...] = ("buddy", "first-fit")
PREEMPTION_MODES: tuple[str, ...] = ("recompute", "swap")
SCHEDULING_POLICIES: tuple[str, ...] = ("fcfs", "priority")
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM releases whose KV-cache/scheduler behaviour pagesim can follow (see README, parity).
VLLM_COMPAT: tuple[str, ...] = ("0.33", "0.23")


def default_batch_limits(gpu: GPUSpec) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) of a stock `vllm serve` on this GPU.

    vLLM's `EngineArgs.get_batch_defaults`: GPUs with >= 70 GiB that are not A100 get
    1024 sequences and 8192 tokens; all others (A100-80GB included) 256 and 2048.
    """
    big = gpu.memory_bytes >= 70 * GiB and not gpu.name.lower().startswith("a100")
    return (1024, 8192) if big else (256, 2048)


@dataclass(frozen=True)
class EngineConfig:
    """Everything that decides how a serving engine schedules and caches.

    Field names are vLLM's (`vllm serve --help`); the CLI flag is the kebab-case name.
    """

    model: str = "llama-2-7b"
    gpu: str = "h200"
    tensor_parallel_size: int = 1
    # ---- cache ----
    block_size: int = 16  # tokens per KV block
    gpu_memory_utilization: float = 0.92  # vLLM >= 0.22 default
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None  # if set, ignores gpu_memory_utilization
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    # vLLM's --disable-hybrid-kv-cache-manager: a model with sliding-window and full-attention
    # layers keeps full KV in every layer, in one KV cache group (no effect on other models)
    disable_hybrid_kv_cache_manager: bool = False
    allocator: str = "paged"  # paged, or a contiguous baseline: reserve-max | pow2 | oracle
    # where contiguous regions go: buddy | first-fit; None (not given): the allocator's own,
    # `default_placement`, resolved when the config is made
    contiguous_placement: str | None = None
    swap_space: float = 4.0  # GiB of CPU swap per GPU (swap preemption only)
    # ---- scheduler ----
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0: no per-request chunk cap
    max_num_partial_prefills: int = 1
    scheduling_policy: str = "fcfs"
    preemption_mode: str = "recompute"
    # Admit a waiting request only if its whole prompt fits in free blocks (vLLM's
    # scheduler_reserve_full_isl, default True in 0.23 and 0.33).
    scheduler_reserve_full_isl: bool = True
    vllm_compat: str = "0.33"  # "0.23": freed unhashed blocks go to the tail, not the head

    def __post_init__(self) -> None:
        # GPU names are case-blind (`GPUSpec.from_name`); keep the spec's spelling, so that
        # `--gpu H200` finds the H200's profiles as `--gpu h200` does
        object.__setattr__(self, "gpu", self.gpu.lower())
        self._check_sizes()
        _check(self.tensor_parallel_size >= 1, "tensor_parallel_size", self.tensor_parallel_size)
        _check(self.block_size >= 1, "block_size", self.block_size)
        _check(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            self.gpu_memory_utilization,
            "must be in (0, 1]",
        )
        if self.num_gpu_blocks_override is not None:
            _check(
                self.num_gpu_blocks_override >= 1,
                "num_gpu_blocks_override",
                self.num_gpu_blocks_override,
                "must be >= 1",
            )
        if self.kv_cache_memory_bytes is not None:
            _check(
                self.kv_cache_memory_bytes > 0, "kv_cache_memory_bytes", self.kv_cache_memory_bytes
            )
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _check_choice("allocator", self.allocator, ALLOCATORS)
        if self.contiguous_placement is None:
            object.__setattr__(self, "contiguous_placement", default_placement(self.allocator))
        _check_choice("contiguous_placement", str(self.contiguous_placement), PLACEMENTS)
        _check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        _check_choice("vllm_compat", self.vllm_compat, VLLM_COMPAT)
        _check(self.swap_space >= 0, "swap_space", self.swap_space, "must be >= 0")
        _check(self.max_num_seqs >= 1, "max_num_seqs", self.max_num_seqs)
        _check(
            self.max_num_batched_tokens >= 1, "max_num_batched_tokens", self.max_num_batched_tokens
        )
        _check(self.max_model_len >= 1, "max_model_len", self.max_model_len)
        _check(
            self.long_prefill_token_threshold >= 0,
            "long_prefill_token_threshold",
            self.long_prefill_token_threshold,
            "must be >= 0 (0: no cap)",
        )
        _check(
            self.max_num_partial_prefills >= 1,
            "max_num_partial_prefills",
            self.max_num_partial_prefills,
        )
        if not self.enable_chunked_prefill:
            _check(
                self.max_num_batched_tokens >= self.max_model_len,
                "max_num_batched_tokens",
                self.max_num_batched_tokens,
                f"must be >= max_model_len ({self.max_model_len}) without chunked prefill",
            )

    def _check_sizes(self) -> None:
        """Types and upper bounds of the numeric fields (the lower bounds follow)."""
        ints = {
            "tensor_parallel_size": MAX_TENSOR_PARALLEL_SIZE,
            "block_size": MAX_BLOCK_SIZE,
            "max_num_seqs": MAX_TOKENS,
            "max_num_batched_tokens": MAX_TOKENS,
            "max_model_len": MAX_TOKENS,
            "long_prefill_token_threshold": MAX_TOKENS,
            "max_num_partial_prefills": MAX_TOKENS,
            "num_gpu_blocks_override": MAX_BLOCKS,
            "kv_cache_memory_bytes": 1 << 50,
        }
        for name, high in ints.items():
            value = getattr(self, name)
            if value is not None:
                check_number(name, value, integer=True, high=high)
        check_number("gpu_memory_utilization", self.gpu_memory_utilization)
        check_number("swap_space", self.swap_space, high=MAX_SWAP_SPACE_GIB)

    @property
    def model_spec(self) -> ModelSpec:
        return ModelSpec.from_name(self.model)

    @property
    def gpu_spec(self) -> GPUSpec:
        return GPUSpec.from_name(self.gpu)

    @classmethod
    def create(cls, **overrides: Any) -> EngineConfig:
        """Build a config, resolving hardware- and model-dependent defaults as vLLM does.

        Values given as None are treated as not given. Unknown keys raise `ConfigError`.
        Both `max_num_seqs` and `max-num-seqs` spellings are accepted.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        given: dict[str, Any] = {}
        for key, value in overrides.items():
            k = key.replace("-", "_")
            if k not in names:
                raise ConfigError(f"unknown engine setting {key!r}")
            if value is not None:
                given[k] = value
        model = ModelSpec.from_name(given.get("model", cls.model))
        gpu = GPUSpec.from_name(given.get("gpu", cls.gpu))
        seqs, tokens = default_batch_limits(gpu)
        given.setdefault("max_num_seqs", seqs)
        given.setdefault("max_model_len", model.max_position_embeddings)
        if given["max_model_len"] > model.max_position_embeddings:
            raise ConfigError(
                f"max_model_len={given['max_model_len']} exceeds {model.name}'s "
                f"max_position_embeddings={model.max_position_embeddings}"
            )
        if "max_num_batched_tokens" not in given:
            chunked = given.get("enable_chunked_prefill", True)
            given["max_num_batched_tokens"] = (
                tokens if chunked else max(tokens, given["max_model_len"])
            )
        config = cls(**given)
        config.verify_as_vllm()
        return config

    def verify_as_vllm(self) -> None:
        """The contradictions that vLLM's own config checks refuse, in vLLM's words.

        Run on every config built from user settings (`create`); tests and internal callers
        that build the dataclass directly may use small budgets vLLM would refuse.
        """
        heads = self.model_spec.num_attention_heads
        if heads % self.tensor_parallel_size:
            raise ConfigError(
                f"Total number of attention heads ({heads}) must be divisible by tensor "
                f"parallel size ({self.tensor_parallel_size})."
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater "
                f"than or equal to max_num_seqs ({self.max_num_seqs})."
            )
        if self.long_prefill_token_threshold > self.max_model_len:
            raise ConfigError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) cannot "
                f"be greater than the max_model_len ({self.max_model_len})."
            )

    def replace(self, **changes: Any) -> EngineConfig:
        """A copy with `changes`. A new `allocator` without a placement takes that allocator's
        default placement, unless this config's placement differs from its own allocator's
        default (then it was chosen, and is kept)."""
        if (
            "allocator" in changes
            and "contiguous_placement" not in changes
            and self.contiguous_placement == default_placement(self.allocator)
        ):
            changes["contiguous_placement"] = None
        return dataclasses.replace(self, **changes)


def default_placement(allocator: str) -> str:
    """Where an allocator's regions go unless `contiguous_placement` says: `oracle` regions
    first-fit, the others in a buddy allocator (as the vLLM paper assumes for Orca). A buddy
    can place an exact region only in a free block of the next power of two (it then gives
    the tail back, `pagesim.kvcache.buddy`), so under it `oracle` admits about as many
    requests as `pow2`; first-fit places exact regions where they fit, which is what an exact
    reservation is for. Paged blocks ignore it (buddy, the value results have always shown)."""
    return "first-fit" if allocator == "oracle" else "buddy"


def _check(ok: bool, name: str, value: object, why: str = "must be >= 1") -> None:
    if not ok:
        raise ConfigError(f"{name}={value!r}: {why}")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value!r}: choose one of {', '.join(choices)}")
