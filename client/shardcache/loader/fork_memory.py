"""Memory a forked DataLoader worker shares with the trainer: the collector's part (`frozen_for_fork`).

A worker forked from the trainer shares every page of the trainer's heap until one side writes to it. A
dataset of 10^6 shards holds about 2 * 10^6 objects that the cyclic garbage collector tracks (the
`ShardRef`s, their dicts); a full collection in a worker writes to every one of them (the collector's
bookkeeping sits in each object's header), and the worker then holds a private copy of all those pages:
measured 8.7 MB -> 68 MB per worker at 10^5 shards after one `gc.collect()`. Objects in the collector's
permanent generation (`gc.freeze()`) are never examined, so freezing just before the fork and unfreezing
in the trainer right after leaves the workers' collections off the trainer's objects (CPython's own advice
for pre-fork servers), and the trainer's collector as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_for_fork() -> Iterator[None]:
    """Freeze what the collector tracks while the body forks workers; unfreeze after, in this process.

    A process that froze objects itself (`gc.get_freeze_count()` > 0) manages its own permanent generation:
    it is left as it is (unfreezing would undo that process's own freeze). Under the forkserver and spawn
    start methods it changes nothing for the workers and costs nothing (both calls move one list).
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
