"""Which KV cache group's block table, and which physical K/V tensor, each layer uses.

vLLM's hybrid KV cache manager (Gemma 2, GPT-OSS) groups a model's layers by attention kind,
every group holding the same number of layers (`pagesim.kvcache.sizing.kv_cache_groups`); a
request holds one block-table row per group over one shared block pool, and layer i of every
group shares one physical K/V tensor. A block id belongs to one group at a time, so layers that
share a tensor never write the same block, and one block of the pool is `block_size` tokens of
one group's layers: the page size sizing counts.

    gemma-2-9b, 42 layers alternating sliding and full: two groups of 21 layers
        group 0 (sliding)   layers 0, 2, 4, ..., 40    tensors 0, 1, 2, ..., 20
        group 1 (full)      layers 1, 3, 5, ..., 41    tensors 0, 1, 2, ..., 20

With one block table (a model of one attention kind, or vLLM's
--disable-hybrid-kv-cache-manager) there is one group and every layer has a tensor of its own.
A layer's attention kind (its sliding window) is its own either way: only the table and the
memory are the group's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.kvcache.sizing import kv_cache_groups
from pagesim.specs import ModelSpec


@dataclass(frozen=True)
class KVLayout:
    """Per group its attention kind; per layer its group and its K/V tensor."""

    group_kinds: tuple[str, ...]  # per KV cache group: "full" or "sliding"
    layer_group: tuple[int, ...]  # per layer: the group whose block table it reads
    layer_tensor: tuple[int, ...]  # per layer: index of its physical K/V tensor pair
    num_tensors: int  # physical K/V tensor pairs (layers per group when hybrid)

    @property
    def num_groups(self) -> int:
        return len(self.group_kinds)

    @property
    def is_hybrid(self) -> bool:
        return len(self.group_kinds) > 1

    @classmethod
    def of(cls, spec: ModelSpec, hybrid_kv_cache_manager: bool) -> KVLayout:
        """vLLM's grouping of `spec`'s layers: each kind's layers in order, cut into groups of
        the common group size (the last one padded with no layer)."""
        kinds = spec.attention_kinds
        n = len(kinds)
        groups = kv_cache_groups(spec, hybrid_kv_cache_manager)
        if len(groups) == 1:
            return cls((groups[0].kind,), (0,) * n, tuple(range(n)), n)
        size = groups[0].num_layers
        layer_group, layer_tensor = [0] * n, [0] * n
        for kind in dict.fromkeys(kinds):
            group_ids = [g for g, group in enumerate(groups) if group.kind == kind]
            layers = [i for i, k in enumerate(kinds) if k == kind]
            for j, layer in enumerate(layers):
                layer_group[layer] = group_ids[j // size]
                layer_tensor[layer] = j % size
        return cls(tuple(g.kind for g in groups), tuple(layer_group), tuple(layer_tensor), size)
