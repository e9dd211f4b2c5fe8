"""Which epoch the next pass over a dataset reads: `EpochClock`.

Frameworks iterate a dataset once per epoch and most never call `set_epoch` on it (Lightning calls it on a
sampler only; a plain loop forgets it), so a pass that repeats the previous order would be the silent
default. The rule, as MosaicML Streaming and litdata have it: **a new pass after one that yielded an item
reads the next epoch**. `set_epoch(e)` makes the next pass read `e` (later passes go on from it), so code
that calls it every epoch (the Hugging Face Trainer, Accelerate's loaders, a DistributedSampler habit)
keeps its numbering. A pass abandoned midway still counts as its epoch: the next one reads a new order (a
framework that stops an epoch early with `limit_train_batches` or `max_steps` then still sees fresh data);
to finish an interrupted epoch, resume from its state. A pass that yielded nothing (an `iter()` a framework
makes only to check that the object is iterable) does not count.

The clock lives in shared memory because a plain `torch.utils.data.DataLoader` iterates the dataset in its
worker processes only: the trainer's copy never sees a pass. Each worker counts the passes it started in
its own cell, so the workers of one pass agree on the epoch whether they are forked anew every epoch or
persist (`persistent_workers=True`, whose copies would otherwise never see a later `set_epoch`).
`multiprocessing.RawArray` is the one shared memory that reaches workers under every start method: fork
inherits it, spawn and forkserver receive it while the worker is being started (`shareable()`).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from typing import Any

# Worker ids beyond this share the last cell: they still agree with each other, just not with the rest.
MAX_WORKERS = 255
_UNSET = -1  # cell 0 holds no epoch: the pass reads its context's


class EpochClock:
    """The epoch of the next pass; cell 0 is the next pass's epoch (set or advanced), cell 1 + w the passes
    DataLoader worker w started since cell 0 was last written."""

    __slots__ = ("_cells",)

    def __init__(self, epoch: int | None = None) -> None:
        self._cells: Any = multiprocessing.RawArray("q", MAX_WORKERS + 2)
        self._cells[0] = _UNSET if epoch is None else epoch

    @property
    def next(self) -> int | None:
        """The epoch the next pass reads (None: its context's)."""
        value = int(self._cells[0])
        return None if value == _UNSET else value

    def set(self, epoch: int | None) -> None:
        """`set_epoch`: the next pass reads `epoch`, in this process and in every worker."""
        cells = self._cells
        cells[0] = _UNSET if epoch is None else epoch
        for i in range(1, len(cells)):
            cells[i] = 0

    def passed(self, epoch: int) -> None:
        """A pass of `epoch` in this process yielded its first item: the next one reads epoch + 1."""
        self.set(epoch + 1)

    def worker_pass(self, worker_id: int, base: int) -> int:
        """The epoch of the pass DataLoader worker `worker_id` starts now (`base`: the context's epoch when
        none was set): the next epoch, plus the passes this worker already started since."""
        cell = 1 + min(worker_id, MAX_WORKERS)
        started = int(self._cells[cell])
        self._cells[cell] = started + 1
        start = self.next
        return (base if start is None else start) + started

    def __getstate__(self) -> dict[str, Any]:
        # Shared only with a worker being started (the one moment multiprocessing lets it travel); any
        # other pickle (a saved pipeline, a copy) carries the next epoch in a clock of its own.
        if multiprocessing.context.get_spawning_popen() is not None:
            return {"cells": self._cells}
        return {"epoch": self.next}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "cells" in state:
            self._cells = state["cells"]
        else:
            EpochClock.__init__(self, state["epoch"])
