"""vLLM's `allocate_slots` signature, stated once for the paged, hybrid and contiguous KV cache
managers: the scheduler calls any of them the same way, and each implements only what it
does with the call (`SlotAllocator._allocate_slots`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from pagesim.request import Request

BlocksT = TypeVar("BlocksT")


@dataclass(frozen=True, slots=True)
class SlotExtras(Generic[BlocksT]):
    """An `allocate_slots` call's arguments beyond the request and its new tokens: a prefix hit
    from `get_computed_blocks`, lookahead slots, the full-prompt admission gate. A running
    request that grows by its new tokens passes none (an empty hit counts as none), and gets
    `NO_EXTRAS`: nothing is built on the path every decode takes."""

    num_new_computed_tokens: int = 0
    new_computed_blocks: BlocksT | None = None
    num_lookahead_tokens: int = 0
    full_sequence_must_fit: bool = False


NO_EXTRAS: SlotExtras[Any] = SlotExtras()


class SlotAllocator(Generic[BlocksT]):
    """Mixin: `allocate_slots` for a manager whose allocation results are `BlocksT`."""

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: BlocksT | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> BlocksT | None:
        """Give the request slots for `num_new_tokens` more tokens (plus lookahead).

        `num_new_computed_tokens` / `new_computed_blocks` are a prefix hit from
        `get_computed_blocks` (new requests only). With `full_sequence_must_fit` (vLLM's
        `scheduler_reserve_full_isl` admission gate) it first fails unless the whole current
        sequence (`request.num_tokens`, hits counted) would fit in the free blocks.

        Returns the newly allocated blocks, or None when the free blocks do not suffice; then
        nothing has changed (the exceptions each manager's `_allocate_slots` names). Raises
        `AllocationError` for a request that could never fit in the whole cache, and
        `InternalError` for a call that breaks the contract (a zero or negative
        `num_new_tokens`, hit arguments that disagree).
        """
        extras: SlotExtras[BlocksT] = NO_EXTRAS
        if (
            num_new_computed_tokens
            or new_computed_blocks
            or num_lookahead_tokens
            or full_sequence_must_fit
        ):
            extras = SlotExtras(
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                full_sequence_must_fit,
            )
        return self._allocate_slots(request, num_new_tokens, extras)

    def _allocate_slots(
        self, request: Request, num_new_tokens: int, extras: SlotExtras[BlocksT]
    ) -> BlocksT | None:
        raise NotImplementedError
