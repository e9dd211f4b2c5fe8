"""Worker processes' batches through a shared-memory ring each worker allocates once (`shared_ring=True`).

torch's DataLoader moves every tensor of every batch into a fresh shared-memory segment, passes its file
descriptor over a Unix socket, and the trainer maps it (page faults on every page) and unmaps it when the
batch is freed; a numpy array is pickled through the pipe (copied twice). Here each worker process makes one
segment at its first batch, `SLOTS` slots of the batch's size (rounded up), sends it to the trainer once
(torch passes that one descriptor), and from then on copies each batch's tensors and arrays into a free
slot: one copy, the message that crosses the pipe holds only offsets, and the trainer's tensors are views of
the slot, with no new mapping.

A slot belongs to one side at a time, so no lock: its flag byte (in the segment's header) is `FREE` while
the worker owns it, `FILLED` from when the worker has filled it until the trainer takes the batch,
`HELD` until the trainer has dropped every tensor of that batch (`_SlotLease`: the views hold it, and its
finaliser writes `FREE`). A worker that finds no free slot (the training loop still holds them) hands that
batch to torch as before, so it never waits on the trainer; a batch larger than a slot makes it allocate a
larger segment. The DataLoader drops the batches in flight when a pass ends early (persistent workers
resume with the next epoch's): their slots stay `FILLED`, and the worker takes them back when its next pass
starts, after that drop. The worker sends its segment along with each batch until the trainer has it
(`_RECEIVED`), so a dropped first batch does not leave the trainer without it.

Torch's DataLoader stays the supervisor: it starts, watches and stops the workers and moves the messages.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

# Slots per worker: the DataLoader's queue holds prefetch_factor (2) batches per worker, the merge one more,
# and the training loop the one it trains on; a fifth covers a framework that keeps the previous batch.
SLOTS = 5
_ALIGN = 64  # every leaf starts on a cache line, so any dtype views it aligned
_HEADER = 64  # one flag byte per slot, and the trainer's receipt of the segment in the last byte
_RECEIVED = _HEADER - 1
FREE, FILLED, HELD = 0, 1, 2
_HEADROOM = 1.25  # later batches may be a little larger (a longer caption, a padded sequence)


def _aligned(size: int) -> int:
    return (size + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class _Leaf:
    """Where one tensor or array of a batch lies in its slot."""

    offset: int
    nbytes: int
    dtype: Any  # a torch.dtype (tensor) or a numpy dtype (array)
    shape: tuple[int, ...]
    tensor: bool


@dataclass(frozen=True)
class RingBatch:
    """What crosses the pipe for a batch in the ring: its structure with `_Leaf`s for its tensors and arrays.

    `segment` is the ring's tensor until the trainer has received it (torch passes its descriptor then), and
    None after: the trainer keeps it by `owner` (worker pid, segment number).
    """

    owner: tuple[int, int]
    slot: int
    slot_bytes: int
    skeleton: object
    segment: torch.Tensor | None


def _walk(payload: object, leaf: Callable[[object], object]) -> object:
    """`payload` with `leaf(x)` for each tensor or array in it (through dicts, lists and tuples)."""
    if isinstance(payload, dict):
        return {key: _walk(value, leaf) for key, value in payload.items()}
    if isinstance(payload, list):
        return [_walk(value, leaf) for value in payload]
    if isinstance(payload, tuple):
        items = [_walk(value, leaf) for value in payload]
        if hasattr(payload, "_fields"):  # a namedtuple takes its fields as arguments
            named: Any = type(payload)
            return named(*items)
        return tuple(items)
    return leaf(payload)


def _is_leaf(value: object) -> bool:
    """A plain CPU tensor or numpy array (a subclass, a quantized or nested tensor keeps torch's path: it
    would come back as a plain one)."""
    import torch

    if type(value) is torch.Tensor:
        return (
            value.device.type == "cpu"
            and value.layout == torch.strided
            and not value.requires_grad
            and not value.is_quantized
            and not value.is_nested
        )
    return type(value) is np.ndarray and not value.dtype.hasobject


class RingWriter:
    """A worker process's ring: packs each batch into a free slot (see the module)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._segment: torch.Tensor | None = None
        self._flags: np.ndarray | None = None
        self._slot_bytes = 0
        self._number = 0
        self._next = 0

    def reclaim(self) -> None:
        """Take back the slots of batches the DataLoader dropped (at the start of a pass: see the module)."""
        flags = self._flags
        if flags is not None:
            filled = flags[:SLOTS] == FILLED
            flags[:SLOTS][filled] = FREE

    def pack(self, payload: object) -> object:
        """`payload` as a `RingBatch`, or as it is when it holds no tensor or array or no slot is free."""
        leaves: list[Any] = []
        _walk(payload, lambda value: leaves.append(value) if _is_leaf(value) else None)
        if not leaves:
            return payload
        size = sum(_aligned(int(leaf.nbytes)) for leaf in leaves)
        if self._segment is None or size > self._slot_bytes:
            self._allocate(size)
        slot = self._free_slot()
        if slot is None:
            return payload  # the trainer still holds every slot: torch's own path, no waiting
        return self._fill(payload, slot)

    def _allocate(self, size: int) -> None:
        import torch

        self._slot_bytes = _aligned(int(size * _HEADROOM))
        segment = torch.zeros(_HEADER + SLOTS * self._slot_bytes, dtype=torch.uint8)
        segment.share_memory_()  # type: ignore[no-untyped-call]
        self._segment, self._flags = segment, segment[:_HEADER].numpy()
        self._number += 1

    def _free_slot(self) -> int | None:
        flags = self._flags
        assert flags is not None
        for i in range(SLOTS):
            slot = (self._next + i) % SLOTS
            if flags[slot] == FREE:
                self._next = (slot + 1) % SLOTS
                return slot
        return None

    def _fill(self, payload: object, slot: int) -> RingBatch:
        import torch

        segment, flags = self._segment, self._flags
        assert segment is not None and flags is not None
        base = _HEADER + slot * self._slot_bytes
        at = [0]

        def place(value: object) -> object:
            if not _is_leaf(value):
                return value
            start = at[0]
            if isinstance(value, torch.Tensor):
                nbytes = value.nelement() * value.element_size()
                target = segment[base + start : base + start + nbytes]
                target.view(value.dtype).view(value.shape).copy_(value)
                leaf = _Leaf(start, nbytes, value.dtype, tuple(value.shape), True)
            else:
                array = value if isinstance(value, np.ndarray) else np.asarray(value)
                nbytes = array.nbytes
                target_array = segment[base + start : base + start + nbytes].numpy()
                np.copyto(target_array.view(array.dtype).reshape(array.shape), array)
                leaf = _Leaf(start, nbytes, array.dtype, array.shape, False)
            at[0] = start + _aligned(nbytes)
            return leaf

        skeleton = _walk(payload, place)
        flags[slot] = FILLED  # the trainer's from here until it drops the batch
        sent = None if flags[_RECEIVED] else segment
        return RingBatch((self.pid, self._number), slot, self._slot_bytes, skeleton, sent)


class _SlotLease:
    """The memory of one filled slot, as numpy sees it (`__array_interface__`): every tensor and array of
    the batch is a view of it and keeps it alive; when the last goes, the slot is the worker's again."""

    def __init__(self, segment: np.ndarray, slot: int, slot_bytes: int) -> None:
        self._segment = segment  # kept alive as long as any view of the slot
        self._slot = slot
        start = segment.ctypes.data + _HEADER + slot * slot_bytes
        self.__array_interface__ = {
            "shape": (slot_bytes,),
            "typestr": "|u1",
            "data": (start, False),  # writable: tensors of a batch are as writable as torch's own
            "version": 3,
        }

    def __del__(self) -> None:
        self._segment[self._slot] = FREE


class RingReader:
    """The trainer's side: keeps each worker's segment and turns `RingBatch`es back into batches."""

    def __init__(self) -> None:
        self._segments: dict[tuple[int, int], np.ndarray] = {}

    def unpack(self, payload: object) -> object:
        if not isinstance(payload, RingBatch):
            return payload
        import torch

        if payload.segment is not None and payload.owner not in self._segments:
            # A worker's new segment replaces its older one (whose batches keep it alive while held).
            worker = payload.owner[0]
            for key in [key for key in self._segments if key[0] == worker]:
                del self._segments[key]
            self._segments[payload.owner] = segment = payload.segment.numpy()
            segment[_RECEIVED] = 1  # the worker stops sending it
        segment = self._segments[payload.owner]
        segment[payload.slot] = HELD
        memory = np.asarray(_SlotLease(segment, payload.slot, payload.slot_bytes))

        def rebuild(value: object) -> object:
            if not isinstance(value, _Leaf):
                return value
            raw = memory[value.offset : value.offset + value.nbytes]
            if value.tensor:
                return torch.from_numpy(raw).view(value.dtype).view(value.shape)
            return raw.view(value.dtype).reshape(value.shape)

        return _walk(payload.skeleton, rebuild)

    def unpack_items(self, items: Iterator[Any]) -> Iterator[Any]:
        """The DataLoader's items (`shardcache.loader.stream.Item`) with their payloads unpacked."""
        for wid, payload, state, done, times in items:
            yield wid, self.unpack(payload), state, done, times


def private_collate(batch: list[Any]) -> Any:
    """torch's `default_collate`, stacking into the worker's private memory: in a worker process torch stacks
    each tensor into a new shared-memory segment, which the ring makes a wasted one (it copies the batch into
    its slot)."""
    import torch
    from torch.utils.data._utils.collate import collate, default_collate_fn_map

    def stack(tensors: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
        return torch.stack(tensors, 0)

    return collate(batch, collate_fn_map={**default_collate_fn_map, torch.Tensor: stack})
