"""The fork gate of TorchLoader's worker threads: no fork copies a lock one of them holds.

A thread that holds a lock (a module's import lock, a library's) at the instant the trainer forks leaves it
held for ever in the child: a DataLoader worker forked then (a framework's validation loader, a loader with
worker processes) waits on it for ever. Each step of a worker thread (one `next()` of its stream,
`shardcache.loader.threads`) runs inside `FORK_GATE.step()`; a fork (`os.register_at_fork`) waits until no
step runs and holds new ones off until it is done, as `shardcache.forksafe.background_work` does for our
other threads (whose lock admits one thread at a time; here many steps run at once).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

# How long a fork waits for the running worker steps before it forks anyway (with a warning).
FORK_WAIT_S = 30.0
THREAD_PREFIX = "shardcache-worker-"  # the worker threads' names, for the warning


class _ForkGate:
    """Worker steps run at once; a fork (`os.register_at_fork`) waits until none runs and holds new ones off.

    A step that forks itself (a user's map starting a process) waits for the other steps only. The wait is
    bounded (`FORK_WAIT_S`): a step that never returns must not hang the trainer's fork; the warning names
    the threads it left running.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._running = 0
        self._forking = False
        self._inside = threading.local()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        cond = self._cond
        with cond:
            while self._forking:
                cond.wait()
            self._running += 1
        depth = getattr(self._inside, "depth", 0)
        self._inside.depth = depth + 1
        try:
            yield
        finally:
            self._inside.depth = depth
            with cond:
                self._running -= 1
                cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()  # held across the fork; released by the parent, replaced in the child
        self._forking = True
        own = 1 if getattr(self._inside, "depth", 0) else 0
        deadline = time.monotonic() + FORK_WAIT_S
        while self._running > own:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]
                logger.warning(
                    "forking while TorchLoader worker threads %s are still inside a step after %.0fs; the "
                    "child may inherit a lock one of them holds",
                    names,
                    FORK_WAIT_S,
                )
                break
            self._cond.wait(remaining)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        # The child has none of the parent's worker threads: a fresh gate with nothing running.
        self._cond = threading.Condition(threading.Lock())
        self._running = 0
        self._forking = False
        self._inside = threading.local()


FORK_GATE = _ForkGate()
os.register_at_fork(
    before=FORK_GATE.before_fork,
    after_in_parent=FORK_GATE.after_fork_in_parent,
    after_in_child=FORK_GATE.after_fork_in_child,
)
