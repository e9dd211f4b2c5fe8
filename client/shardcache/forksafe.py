"""Why a DataLoader worker forked from the trainer is safe: the client's rules for `os.fork`.

torch's default DataLoader start method on Linux is fork. A forked child has only the forking thread; every
lock another thread held at that instant stays held in the child, forever. The trainer process runs
threads of ours (telemetry reporting, TorchLoader's stall watchdog) and of libraries (fsspec's IO loop,
torch's pin-memory thread), so without rules a worker can wait forever on a lock nobody in it will release.
Seen before these rules (4 epochs, 2 workers, the daemon running): 5 of 6 runs of a plain script hung at
the second epoch, in `_ModuleLock.acquire` under `import httpx` (placed inside a function), under httpx's
own lazy `import httpcore`, or in `ssl.SSLContext.__new__`, while the parent's telemetry thread was
sending its first report (importing httpx and building an SSL context) as the next epoch forked.

The rules, each held by a test in `tests/client/daemon_access/test_fork_safety.py`:

1. **Nothing a worker runs imports lazily or builds an SSL context.** A child that imports a module
   another thread was importing at the fork waits on that module's import lock. So the client imports
   what its workers' code paths use when `shardcache` is imported (httpx, httpcore, certifi in
   `shardcache.daemon_access.control`), and the control plane, which speaks plain HTTP over a Unix
   socket, hands httpx one TLS context built at import (`NO_TLS`) instead of letting each transport build
   one.
2. **Our background threads work inside `background_work()`**, and a fork (`os.register_at_fork`'s
   `before`) takes the same lock: a fork waits until they are idle (a telemetry report is bounded by its
   2 s timeout), and they wait while a fork happens. The lock is made anew in the child.
3. **Objects of ours that hold locks start the child clean**: `reset_in_child(obj)` calls
   `obj._reset_after_fork()` in every forked child (`ControlClient` drops its lock and the parent's
   pooled httpx client there).

What this cannot cover, and how the product avoids it: a library thread holding a lock of that library at
the fork (fsspec's IO thread mid-request, lance's runtime). Workers that read through the daemon touch
neither; a worker that reads directly with s3fs gets fsspec's own after-fork reset of its loop; lance is
not fork-safe, so lance data is read in forkserver or spawn workers (see `TorchLoader`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Protocol

# Reentrant: a thread that forks from inside its own background work must not wait for itself.
_work_lock = threading.RLock()


class ResetsAfterFork(Protocol):
    def _reset_after_fork(self) -> None: ...


_resettable: weakref.WeakSet[ResetsAfterFork] = weakref.WeakSet()


@contextlib.contextmanager
def background_work() -> Iterator[None]:
    """Run a background thread's unit of work so that no fork happens in the middle of it."""
    lock = _work_lock  # the child replaces the module's lock; release the one acquired
    with lock:
        yield


def reset_in_child(obj: ResetsAfterFork) -> None:
    """Call `obj._reset_after_fork()` in every child forked from now on (held weakly)."""
    _resettable.add(obj)


def _before_fork() -> None:
    _work_lock.acquire()


def _after_fork_in_parent() -> None:
    _work_lock.release()


def _after_fork_in_child() -> None:
    global _work_lock
    _work_lock = threading.RLock()
    for obj in list(_resettable):
        obj._reset_after_fork()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)
