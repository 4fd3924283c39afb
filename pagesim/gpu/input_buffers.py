"""Persistent step inputs of the graph path: block-table rows kept across steps, and one
pinned host buffer copied to the device in one transfer.

A served decode step is a few ms of device time, and everything the host does around it
lands on the step's critical path. Building a step's inputs from scratch (a block table row
converted from a Python list per sequence, a fresh numpy array per input, a pageable-memory
copy per tensor) is a sizeable share of it (docs/architecture.md, "GPU runner host costs"),
and that host time is also what moves most between GPU calls. vLLM's model runner keeps its
inputs in persistent CPU/GPU buffer pairs and its block table rows across steps; this module
does the same for `StepGraphs`:

    BlockTableRows   one row per live request, found by request id, built from the
                     scheduler's block-id deltas: a step writes only the ids appended since
                     the request's last step (a new block every block_size decode steps),
                     and the step's table is one gather of its rows.
    GatheredTable    the step's table gathered into the staged buffer, columns in use only.
    StagedBuffers    every per-step input of the graph path laid out in one pinned host
                     buffer and one device buffer of the same layout; a step fills the host
                     side through numpy views and copies the bytes it uses with one
                     asynchronous transfer. The block table comes last, so a step of `s`
                     sequences copies only its `s` rows.

A row sent whole (a new or resumed request, entries changed in place) is rewritten unless it
is what the row holds; the gathered table equals `build_block_table` of the manager's rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch

from pagesim.errors import InternalError
from pagesim.kvcache.block_table import NULL_BLOCK_ID
from pagesim.scheduler.output import SchedulerOutput

#: Byte alignment of every field of a staged buffer (Triton specializes pointers on 16).
ALIGN = 16


class BlockTableRows:
    """Block-table rows of live requests, `[rows, width]` int32, kept across steps.

    `update(out)` applies a step's block ids (`SchedulerOutput`) and returns the row of each
    scheduled request; `free(request_ids)` returns finished or preempted requests' rows.
    Rows grow by doubling when every row is taken.
    """

    __slots__ = ("width", "table", "lengths", "_rows", "_free")

    def __init__(self, width: int, num_rows: int = 64) -> None:
        if width < 1 or num_rows < 1:
            raise ValueError(f"width={width}, num_rows={num_rows}: both must be >= 1")
        self.width = width
        self.table = np.full((num_rows, width), NULL_BLOCK_ID, dtype=np.int32)
        # per row: how many of its entries are blocks (the rest is the null block)
        self.lengths = np.zeros(num_rows, dtype=np.int64)
        # request id -> (row, the block ids written there)
        self._rows: dict[str, tuple[int, list[int]]] = {}
        self._free: list[int] = list(range(num_rows - 1, -1, -1))

    @property
    def num_live(self) -> int:
        return len(self._rows)

    def update(self, out: SchedulerOutput, group: int | None = None) -> list[int]:
        """Free the step's finished and preempted requests' rows, then bring each scheduled
        request's row up to date; their rows, in scheduled order. With `group` (the hybrid
        KV cache manager's ids: one row per KV cache group) these are that group's rows."""
        self.free(out.finished_req_ids)
        self.free(out.preempted_req_ids)
        row_index = self.row_index
        if group is None:
            return [
                row_index(sr.request.request_id, sr.block_ids, sr.new_block_ids)  # type: ignore[arg-type]
                for sr in out.scheduled  # one KV cache group: its ids are one row
            ]
        return [
            row_index(
                sr.request.request_id,
                None if sr.block_ids is None else sr.block_ids[group],  # type: ignore[arg-type]
                sr.new_block_ids[group] if sr.new_block_ids else (),  # type: ignore[arg-type]
            )
            for sr in out.scheduled
        ]

    def block_ids(self, request_id: str) -> list[int]:
        """The ids written in the request's row (the live list: do not mutate)."""
        return self._rows[request_id][1]

    def row_index(
        self, request_id: str, block_ids: list[int] | None, new_block_ids: Sequence[int] = ()
    ) -> int:
        """The row of `request_id` after `block_ids` replaced it (when given) or
        `new_block_ids` were appended to it."""
        entry = self._rows.get(request_id)
        if block_ids is None:  # the row grows
            if entry is None:
                raise InternalError(f"request {request_id!r}: new block ids for no row")
            if not new_block_ids:  # the common decode step
                return entry[0]
            row, written = entry
            start, new = len(written), new_block_ids
        elif entry is not None and entry[1] == block_ids:  # resent unchanged
            return entry[0]
        else:  # a new row, or one rewritten whole
            row, written, start, new = -1 if entry is None else entry[0], [], 0, block_ids
        n = start + len(new)
        if n > self.width:
            raise ValueError(f"request {request_id}: {n} blocks > table width {self.width}")
        if row < 0:
            row = self._take()
        r = self.table[row]
        r[start:n] = new
        r[n : max(n, int(self.lengths[row]))] = NULL_BLOCK_ID  # past the old blocks: null already
        self.lengths[row] = n
        written.extend(new)
        self._rows[request_id] = (row, written)
        return row

    def free(self, request_ids: Iterable[str]) -> None:
        """Return the rows of requests that finished or were preempted (unknown ids: none)."""
        pop = self._rows.pop
        for rid in request_ids:
            entry = pop(rid, None)
            if entry is not None:
                self._free.append(entry[0])

    def _take(self) -> int:
        if not self._free:
            old = self.table.shape[0]
            grown = np.full((2 * old, self.width), NULL_BLOCK_ID, dtype=np.int32)
            grown[:old] = self.table
            self.table = grown
            self.lengths = np.concatenate([self.lengths, np.zeros(old, dtype=np.int64)])
            self._free = list(range(2 * old - 1, old - 1, -1))
        return self._free.pop()


class GatheredTable:
    """A step's block table, gathered from `BlockTableRows` into a fixed `[rows, width]`
    buffer (the staged host table), touching only the columns in use.

    `width` is max_model_len / block_size, so gathering whole rows reads and writes 8,192
    entries per sequence for a 131,072-token model whose rows hold 64 blocks at a 1,024-token
    context (docs/architecture.md, "GPU runner host costs"). `gather` copies the first `cols`
    columns, `cols` the longest gathered row, and resets to the null block only the columns past it
    that an earlier gather wrote (kept per buffer row), so the buffer holds what gathering whole
    rows would: each row's blocks, then the null block, and null rows for padding.
    """

    __slots__ = ("out", "_cols")

    def __init__(self, out: np.ndarray) -> None:
        """`out` holds the null block everywhere, as a fresh or reset staged buffer does."""
        self.out = out
        # per buffer row: the columns that may hold a block (past them: the null block)
        self._cols = np.zeros(out.shape[0], dtype=np.int64)

    def reset(self) -> None:
        """The buffer was set to the null block everywhere (padding only)."""
        self._cols[:] = 0

    def gather(self, rows: BlockTableRows, idx: list[int], size: int) -> None:
        """out[i] = rows.table[idx[i]] for i < len(idx); null rows up to `size`."""
        n = len(idx)
        out, written = self.out, self._cols
        ix = np.array(idx, dtype=np.intp)  # converted once, indexed twice
        cols = int(rows.lengths[ix].max()) if n else 0
        if cols:
            out[:n, :cols] = rows.table[ix, :cols]
        stale = int(written[:n].max()) if n else 0
        if stale > cols:
            out[:n, cols:stale] = NULL_BLOCK_ID
        written[:n] = cols
        if size > n:
            pad = int(written[n:size].max())
            if pad:
                out[n:size, :pad] = NULL_BLOCK_ID
            written[n:size] = 0


class StagedBuffers:
    """Named arrays laid out in one host buffer (pinned on CUDA) and one device buffer.

    `fields` is `(name, dtype, shape)` in layout order; `host[name]` is a numpy view of the
    host side, `device[name]` a tensor view of the device side. `copy_to_device(nbytes)`
    moves the first `nbytes` bytes in one asynchronous transfer; `offset(name)` says where a
    field starts, so a caller copies only the prefix it filled.

    The host side must not be rewritten while a transfer from it may be in flight: the
    runner's step ends with a device sync (reading the sampled tokens), so the next step's
    writes come after the previous step's copy completed.
    """

    def __init__(
        self, fields: list[tuple[str, torch.dtype, tuple[int, ...]]], device: torch.device
    ) -> None:
        self._offsets: dict[str, int] = {}
        spans: list[tuple[str, torch.dtype, tuple[int, ...], int, int]] = []
        total = 0
        for name, dtype, shape in fields:
            start = -(-total // ALIGN) * ALIGN
            item = torch.empty((), dtype=dtype).element_size()
            total = start + item * int(np.prod(shape, dtype=np.int64))
            self._offsets[name] = start
            spans.append((name, dtype, shape, start, total))
        self.nbytes = -(-total // ALIGN) * ALIGN
        pin = device.type == "cuda"
        self._host = torch.zeros(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        self._device = torch.zeros(self.nbytes, dtype=torch.uint8, device=device)
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, torch.Tensor] = {}
        for name, dtype, shape, start, stop in spans:
            self.host[name] = self._host[start:stop].view(dtype).view(shape).numpy()
            self.device[name] = self._device[start:stop].view(dtype).view(shape)

    def offset(self, name: str) -> int:
        return self._offsets[name]

    def copy_to_device(self, nbytes: int | None = None) -> None:
        """The first `nbytes` (default: all) host bytes to the device, asynchronously."""
        n = self.nbytes if nbytes is None else nbytes
        self._device[:n].copy_(self._host[:n], non_blocking=True)


def decode_slots(table: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Slot of each decode token: row i of `table` holds sequence i's blocks, `positions[i]`
    its new token's position (`build_slot_mapping` for one token per sequence), int64."""
    blocks = table[np.arange(len(positions)), positions // block_size].astype(np.int64)
    return blocks * block_size + positions % block_size


def token_slots(
    table: np.ndarray, starts: np.ndarray, num_new: np.ndarray, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """(positions, slots) of every new token, sequences in order (`build_positions` and
    `build_slot_mapping` over a gathered table), both int64."""
    seq = np.repeat(np.arange(len(num_new)), num_new)
    first = np.cumsum(num_new) - num_new  # each sequence's first row in the step
    positions = starts[seq] + (np.arange(len(seq)) - first[seq])
    blocks = table[seq, positions // block_size].astype(np.int64)
    return positions, blocks * block_size + positions % block_size
