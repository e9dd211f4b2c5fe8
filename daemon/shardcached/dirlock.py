"""One daemon per cache directory: an exclusive `flock` on a lock file inside it, held for the daemon's life.

Two daemons on one cache directory would remove each other's downloads at start-up and evict each other's
files from under their leases. The lock is taken before anything in the directory is touched; the second
daemon exits with a message naming the directory and the holder's pid. The kernel drops the lock when the
holder exits, however it exits (`kill -9` included), so a stale lock file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = ".shardcached.lock"


class CacheDirLocked(RuntimeError):
    """Another process holds the cache directory's lock."""

    def __init__(self, cache_dir: Path, holder: str) -> None:
        super().__init__(
            f"another shardcached (pid {holder}) already uses the cache directory {cache_dir}; stop it, or "
            f"give this daemon another --cache-dir (one daemon per cache directory)"
        )
        self.cache_dir = cache_dir
        self.holder = holder


def lock_cache_dir(cache_dir: Path) -> int:
    """Take the cache directory's lock and write our pid into it; returns the fd to keep open.

    Raises:
        CacheDirLocked: another process holds it.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise CacheDirLocked(cache_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def unlock_cache_dir(fd: int) -> None:
    """Release the lock (closing the fd releases it)."""
    with contextlib.suppress(OSError):
        os.close(fd)
