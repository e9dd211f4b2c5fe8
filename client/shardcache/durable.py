"""The on-disk artifact store's two rules, shared by the `.cache()` snapshots (`shardcache.snapshots.store`)
and the Lance indexes (`shardcache.sources.lance.store`).

- One builder at a time: a `FileLock` (an `fcntl.flock`, dropped by the kernel when its holder dies, so a
  waiter never waits on a dead process).
- A crash never leaves a half-written artifact visible: build in a temporary folder, then `publish` it —
  flush it (`fsync_tree`), rename it into place (a broken artifact already there is moved aside in one
  rename first) and flush the parent (`fsync_dir`) — so a reader sees a whole artifact or none.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shardcache.errors import CacheError


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it, a new file) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` to disk before it is published."""
    for directory, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    """Write `payload` as JSON to `path` via a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it does not exist or is unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


class FileLock:
    """An exclusive `fcntl.flock` on a lock file; released on close or when the holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free; return whether this process holds it now."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        self._fd = fd
        return True

    def acquire(self, deadline: float, what: str) -> None:
        """Wait for the lock until `deadline` (time.monotonic()); CacheError after it."""
        delay = 0.01
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                raise CacheError(
                    f"timed out waiting for {self.path}: another process is still building {what}. Raise "
                    f"the timeout (cache_timeout= or SHARDCACHE_CACHE_TIMEOUT seconds), or stop the other "
                    f"job and remove the entry with `shardcache cache rm`"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the block, waiting as long as it takes (its holder ends or dies)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the flock

    def release(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def publish(tmp: Path, final: Path, *, aside: Path | None = None) -> None:
    """Make `tmp` (already holding its data and marker) visible at `final` in one rename.

    `aside`: where an artifact already at `final` (a broken one being replaced) is moved first, in one
    rename so no reader sees it half gone, then removed; without it, `final` must not exist.
    """
    fsync_tree(tmp)
    final.parent.mkdir(parents=True, exist_ok=True)
    if aside is not None and final.exists():
        os.rename(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
    os.rename(tmp, final)
    fsync_dir(final.parent)
