"""One daemon per cache directory, held for the daemon's life by two locks that the kernel drops at its exit.

Two daemons on one cache directory would remove each other's downloads at start-up and evict each other's
files from under their leases. The locks are taken before anything in the directory is touched; the second
daemon exits with a message naming the directory and the holder's pid. The kernel drops both when the
holder exits, however it exits (`kill -9` included), so nothing stale ever blocks a restart.

- A name in the abstract Unix socket namespace derived from the directory's real path: nothing on disk, so
  `rm -rf` of the directory cannot remove it (a lock file inside the directory goes with the directory, and
  a second daemon could then start on the same path). The holder's pid comes from `SO_PEERCRED`. The
  abstract namespace belongs to the network namespace: daemons in different containers on one host
  directory are kept apart by the second lock.
- An exclusive `flock` on `.shardcached.lock` inside the directory, seen from every mount and network
  namespace that shares the directory. `relock` takes it again in a directory recreated after `rm -rf`.

A lock file beside the directory would survive too, but the hardened deployments cannot write there
(systemd's ProtectSystem=strict makes /var/cache read-only but for the cache directory itself; a
container mounts only the directory).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import struct
from pathlib import Path

LOCK_NAME = ".shardcached.lock"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class CacheDirLocked(RuntimeError):
    """Another process holds the cache directory's lock."""

    def __init__(self, cache_dir: Path, holder: str) -> None:
        super().__init__(
            f"another shardcached (pid {holder}) already uses the cache directory {cache_dir}; stop it, or "
            f"give this daemon another --cache-dir (one daemon per cache directory)"
        )
        self.cache_dir = cache_dir
        self.holder = holder


class CacheDirLock:
    """The two locks of one cache directory; `acquire` takes both, `close` releases both."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._socket: socket.socket | None = None
        self._fd: int | None = None

    def acquire(self) -> None:
        """Create the directory if needed and take both locks.

        Raises:
            CacheDirLocked: another process holds either lock.
        """
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._socket = _bind_abstract(self.cache_dir)
        try:
            self.relock()
        except BaseException:
            self.close()
            raise

    def relock(self) -> None:
        """Take the lock file inside the directory (again, after the directory was recreated).

        Raises:
            CacheDirLocked: another process holds it.
        """
        if self._fd is not None:
            unlock_fd(self._fd)
            self._fd = None
        self._fd = _flock_file(self.cache_dir)

    def close(self) -> None:
        if self._fd is not None:
            unlock_fd(self._fd)
            self._fd = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def abstract_name(cache_dir: Path) -> bytes:
    """The abstract socket name locking `cache_dir` (its real path, hashed: names are at most 107 bytes)."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(cache_dir))).hexdigest()[:32]
    return b"\0shardcached-lock-" + digest.encode()


def _bind_abstract(cache_dir: Path) -> socket.socket:
    name = abstract_name(cache_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(name)
        sock.listen(1)  # listening, so that a second daemon can connect and learn our pid
    except OSError as exc:
        sock.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        raise CacheDirLocked(cache_dir, _holder_pid(name)) from None
    return sock


def _holder_pid(name: bytes) -> str:
    """The pid of the process listening on the abstract `name` (`SO_PEERCRED`), or "unknown"."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.settimeout(2.0)
        probe.connect(name)
        pid, _, _ = _PEERCRED.unpack(probe.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        return str(pid)
    except OSError:
        return "unknown"
    finally:
        probe.close()


def _flock_file(cache_dir: Path) -> int:
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


def unlock_fd(fd: int) -> None:
    """Release a lock file's lock (closing the fd releases it)."""
    with contextlib.suppress(OSError):
        os.close(fd)
