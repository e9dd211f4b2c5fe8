"""The cache directory itself: noticing that it vanished (`rm -rf`, a replaced mount) and recreating it.

The daemon owns the directory, but an operator can still remove it. Every file in it is then gone, and a
download writing there fails with "No such file or directory", which is the cache's fault, never the
remote's: retries.py reports it as 503 `cache_dir_missing`, not 404 `remote_not_found`.

`check` compares the directory with the one the daemon started on (device and inode). When it is gone or
replaced, the whole index is dropped (`Store.forget_all`: the files are gone with it) and the directory is
recreated empty, the lock file inside it taken again (dirlock.py; the abstract socket lock never went
away). While that fails (the path is now a file, the filesystem is read-only or unmounted), `problem` says
why, naming the path: `/v1/health` answers 503 with it (readiness and liveness probes fail, so an
orchestrator restarts the daemon) and opens answer 503 `cache_dir_missing`. The service runs `check` every
second and at once when a download finds the directory missing, so an open that met the loss fetches again
into the recreated directory instead of failing.

Recreating rather than stopping: in-memory state (plans, leases) stays valid, trainers keep their reads, and
the shards come back as they are fetched again; stopping would cost every client a restart wait.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable

from shardcached.storage.dirlock import CacheDirLock, CacheDirLocked
from shardcached.storage.store import Store

logger = logging.getLogger(__name__)

CACHE_DIR_MODE = 0o750  # as the deployments create it (systemd CacheDirectoryMode, the Dockerfile)


class CacheDirWatch:
    """Watches one store's directory; recreates it when it vanished.

    Args:
        store: The store whose index is dropped when the directory vanished.
        lock: The directory's lock, taken again in the recreated directory (None: not locked, tests).
        on_lost: Called with the URLs dropped from the index (the planner forgets their residency).
    """

    def __init__(
        self,
        store: Store,
        lock: CacheDirLock | None,
        on_lost: Callable[[list[str]], None] = lambda urls: None,
    ) -> None:
        self.store = store
        self.path = store.cache_dir
        self._lock = lock
        self._on_lost = on_lost
        self._identity = self._stat_identity()
        self.problem: str | None = None  # why the directory is unusable now; None while it is fine
        self.losses = 0

    def _stat_identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino) if stat.S_ISDIR(info.st_mode) else None

    def present(self) -> bool:
        """Whether the directory is still the one the daemon holds (one `stat`)."""
        identity = self._stat_identity()
        return identity is not None and identity == self._identity

    def check(self) -> bool:
        """True when the directory is usable; after a loss, drop the index and recreate it first."""
        if self.present():
            return True
        if self.problem is None:  # a new loss: the index goes once
            self.losses += 1
            urls = self.store.forget_all()
            self._on_lost(urls)
            self.problem = (
                f"the cache directory {self.path} was removed or replaced while shardcached ran "
                f"({len(urls)} shards lost); it is being recreated"
            )
            logger.error("%s", self.problem)
        self._recreate()
        return self.problem is None

    def _recreate(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=CACHE_DIR_MODE)
            if self._lock is not None:
                self._lock.relock()
        except CacheDirLocked as exc:
            self.problem = f"the cache directory {self.path} was recreated by someone else: {exc}"
            logger.error("%s", self.problem)
            return
        except OSError as exc:
            self.problem = (
                f"the cache directory {self.path} is gone and cannot be recreated ({exc}); restore it (a "
                f"directory writable by the daemon's user) or restart shardcached"
            )
            logger.error("%s", self.problem)
            return
        self._identity = self._stat_identity()
        self.problem = None
        logger.warning(
            "recreated the cache directory %s empty; shards are fetched again as needed", self.path
        )
