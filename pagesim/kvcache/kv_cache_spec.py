"""What each KV cache group of a model needs from the block pool (vLLM's `KVCacheSpec`,
`KVCacheGroupSpec` and `KVCacheConfig`, reduced to what block management reads).

A hybrid model (Gemma 2/3, GPT-OSS) mixes sliding-window and full-attention layers. vLLM's
hybrid KV cache manager gives each group of same-kind layers its own block table over one
shared pool: one block of the pool holds `block_size` tokens of every layer of one group, so a
request holds one row of blocks per group. Page sizes and the grouping of layers are sizing's
business (`pagesim.kvcache.sizing.kv_cache_groups`); here a group is its attention kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.errors import ConfigError
from pagesim.kvcache.sizing import kv_cache_groups
from pagesim.specs import ModelSpec


@dataclass(frozen=True)
class FullAttentionSpec:
    """Every token stays visible: a request's blocks live until it is freed."""

    block_size: int  # tokens per block

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size={self.block_size!r}: must be an int >= 1")


@dataclass(frozen=True)
class SlidingWindowSpec:
    """The query at position p sees positions p - sliding_window + 1 .. p: blocks wholly before
    that are freed while the request runs."""

    block_size: int  # tokens per block
    sliding_window: int  # tokens

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ConfigError(f"block_size={self.block_size!r}: must be an int >= 1")
        if not isinstance(self.sliding_window, int) or self.sliding_window < 1:
            raise ConfigError(f"sliding_window={self.sliding_window!r}: must be an int >= 1")


KVCacheSpec = FullAttentionSpec | SlidingWindowSpec


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers that share one block table."""

    num_layers: int  # layers whose pages one block of this group holds (padding included)
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool (`num_blocks`, block 0 being the null block) and the groups drawing from it."""

    num_blocks: int
    kv_cache_groups: tuple[KVCacheGroupSpec, ...]

    def __post_init__(self) -> None:
        if not self.kv_cache_groups:
            raise ConfigError("kv_cache_groups=(): need at least one KV cache group")
        sizes = {g.kv_cache_spec.block_size for g in self.kv_cache_groups}
        if len(sizes) > 1:
            raise ConfigError(
                f"kv_cache_groups: block sizes {sorted(sizes)} differ; every group uses "
                "the engine's block_size"
            )

    @property
    def block_size(self) -> int:
        return self.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def is_hybrid(self) -> bool:
        """More than one group: served by the hybrid coordinator."""
        return len(self.kv_cache_groups) > 1

    @classmethod
    def from_model(cls, model: ModelSpec, block_size: int, num_blocks: int) -> KVCacheConfig:
        """vLLM's grouping of the model's layers (hybrid KV cache manager on)."""
        groups = []
        for group in kv_cache_groups(model, hybrid_kv_cache_manager=True):
            spec: KVCacheSpec
            if group.kind == "sliding":
                if model.sliding_window is None:
                    raise ConfigError(f"model {model.name}: sliding layers without sliding_window")
                spec = SlidingWindowSpec(block_size, model.sliding_window)
            else:
                spec = FullAttentionSpec(block_size)
            groups.append(KVCacheGroupSpec(group.num_layers, spec))
        return cls(num_blocks, tuple(groups))
