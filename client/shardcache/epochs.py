"""Which epoch the next pass over a dataset reads: `EpochClock`.

Frameworks iterate a dataset once per epoch and most never call `set_epoch` on it (Lightning calls it on a
sampler only; a plain loop forgets it), so a pass that repeats the previous order would be the silent
default. The rule, as MosaicML Streaming and litdata have it: **a new pass after one that yielded an item
reads the next epoch**, unless `set_epoch` pinned one. `set_epoch(e)` pins `e`: every pass reads it until
the next `set_epoch`, as torch's DistributedSampler keeps the epoch it was given, so code that calls it
before every epoch (the Hugging Face Trainer, Accelerate's loaders, a DistributedSampler habit) keeps its
numbering, and code that wants one fixed order (a validation pass, mvp-dataset's behaviour) pins it. A pass
abandoned midway still counts as its epoch: the next one reads a new order (a framework that stops an
epoch early with `limit_train_batches` or `max_steps` then still sees fresh data); to finish an interrupted
epoch, resume from its state. A pass that yielded nothing (an `iter()` a framework makes only to check that
the object is iterable) does not count.

The clock lives in shared memory because a plain `torch.utils.data.DataLoader` iterates the dataset in its
worker processes only: the trainer's copy never sees a pass. Each worker counts the passes it started in
its own cell, so the workers of one pass agree on the epoch whether they are forked anew every epoch or
persist (`persistent_workers=True`, whose copies would otherwise never see a later `set_epoch`).
`multiprocessing.RawArray` is the one shared memory that reaches workers under every start method: fork
inherits it, spawn and forkserver receive it while the worker is being started (`__getstate__`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    import ctypes

# Worker ids beyond this share the last cell: they still agree with each other, just not with the rest.
MAX_WORKERS = 255
_UNSET = -1  # cell 0 holds no epoch: the pass reads its context's
_EPOCH, _PINNED, _WORKERS = 0, 1, 2  # cells: the next epoch, whether set_epoch pinned it, worker counts


class EpochClock:
    """The epoch of the next pass (see the module): cell 0 is the next pass's epoch, cell 1 whether
    `set_epoch` pinned it, cell 2 + w the passes DataLoader worker w started since cell 0 was written."""

    __slots__ = ("_cells",)

    def __init__(self, epoch: int | None = None, pinned: bool = False) -> None:
        self._cells: ctypes.Array[ctypes.c_int64] = multiprocessing.RawArray("q", _WORKERS + MAX_WORKERS + 1)
        self._write(epoch, pinned)

    @property
    def next(self) -> int | None:
        """The epoch the next pass reads (None: its context's)."""
        value = int(self._cells[_EPOCH])
        return None if value == _UNSET else value

    @property
    def pinned(self) -> bool:
        """Whether `set_epoch` fixed the epoch of every pass until the next `set_epoch`."""
        return bool(self._cells[_PINNED])

    def pin(self, epoch: int) -> None:
        """`set_epoch`: every pass reads `epoch`, in this process and in every worker, until changed."""
        self._write(epoch, True)

    def advance_to(self, epoch: int) -> None:
        """The next pass reads `epoch` and later ones go on from it (a loaded state of an ended pass)."""
        self._write(epoch, False)

    def passed(self, epoch: int) -> None:
        """A pass of `epoch` in this process yielded its first item: the next one reads epoch + 1."""
        if not self.pinned:
            self._write(epoch + 1, False)

    def worker_pass(self, worker_id: int, base: int) -> int:
        """The epoch of the pass DataLoader worker `worker_id` starts now (`base`: the context's epoch when
        none was set): the next epoch, plus the passes this worker already started since, unless pinned."""
        start = self.next
        first = base if start is None else start
        if self.pinned:
            return first
        cell = _WORKERS + min(worker_id, MAX_WORKERS)
        started = int(self._cells[cell])
        self._cells[cell] = started + 1
        return first + started

    def _write(self, epoch: int | None, pinned: bool) -> None:
        cells = self._cells
        cells[_EPOCH] = _UNSET if epoch is None else epoch
        cells[_PINNED] = int(pinned)
        for i in range(_WORKERS, len(cells)):
            cells[i] = 0

    def __getstate__(self) -> dict[str, object]:
        # Shared only with a worker being started (the one moment multiprocessing lets it travel); any
        # other pickle (a saved pipeline, a copy) carries the next epoch in a clock of its own.
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"cells": self._cells}
        return {"epoch": self.next, "pinned": self.pinned}

    def __setstate__(self, state: dict[str, object]) -> None:
        if "cells" in state:
            self._cells = cast("ctypes.Array[ctypes.c_int64]", state["cells"])  # pickled by __getstate__
        else:
            epoch, pinned = state["epoch"], state.get("pinned", False)
            assert epoch is None or isinstance(epoch, int), "pickled by __getstate__"
            assert isinstance(pinned, bool), "pickled by __getstate__"
            EpochClock.__init__(self, epoch, pinned)
