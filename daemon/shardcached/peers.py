"""The processes on the other end of the Unix socket, and noticing within a second when one exits.

`peer_pid` reads `SO_PEERCRED` of a connection once, when it is accepted (coalesce.py's protocol puts it
in every request's scope under `PEER_SCOPE_KEY`): the pid of the process that connected. The client makes
a fresh connection in every process, forked DataLoader workers included, so the pid is the process that
holds what the requests lease.

`PeerWatch.watch(pid)` follows a process until it exits, then calls `on_exit(pid)` on the loop:

- a pidfd (`os.pidfd_open`, Linux 5.3+) becomes readable when the process exits, zombie or reaped; the
  loop's reader sees it at once. A pidfd names the process, not the number, so a reused pid cannot be
  mistaken for it.
- where pidfds are refused (old kernels, seccomp profiles), `sweep`, called every second, checks
  `os.kill(pid, 0)` and `/proc/<pid>/stat` (a zombie still answers the signal).

This follows clients that name no session (older ones): a client with a session is followed by its
session's connection instead (sessions.py), which needs no pid. A pid of 0 is a peer in a PID namespace
the daemon cannot see (a trainer in another container): nothing is tracked, and an older client's leases
there end by their TTL. Releasing too late is the fallback; releasing a live process's leases is never
done: only a positive sign of exit (a readable pidfd, ESRCH, a zombie) counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

PEER_SCOPE_KEY = "shardcache.peer_pid"  # ASGI scope key: the connected process's pid, or None
_UCRED = struct.Struct("3i")  # pid, uid, gid


def peer_pid(transport: Any) -> int | None:
    """The pid of the process connected through `transport`'s Unix socket; None when not visible."""
    sock = transport.get_extra_info("socket")
    so_peercred = getattr(socket, "SO_PEERCRED", None)
    if sock is None or so_peercred is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, so_peercred, _UCRED.size))
    except OSError as exc:
        logger.debug("SO_PEERCRED failed: %s", exc)
        return None
    return pid if pid > 0 else None  # 0: the peer lives in a PID namespace this daemon cannot see


class PeerWatch:
    """Follows client processes and reports each one's exit once (`on_exit(pid)`, on the loop)."""

    def __init__(self, on_exit: Callable[[int], None], *, use_pidfd: bool = True) -> None:
        self._on_exit = on_exit
        self._use_pidfd = use_pidfd and hasattr(os, "pidfd_open")
        self._watched: dict[int, int | None] = {}  # pid -> its pidfd, or None: checked by `sweep`

    def __len__(self) -> int:
        return len(self._watched)

    def watch(self, pid: int | None) -> bool:
        """Follow `pid` (idempotent); False when it cannot be followed (unknown)."""
        if not pid or pid <= 0:
            return False
        if pid in self._watched:
            return True
        fd: int | None = None
        if self._use_pidfd:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                fd = None  # gone already: the next sweep reports it
            except OSError as exc:  # ENOSYS, EPERM under seccomp: fall back to sweeping for good
                logger.info("pidfd_open refused (%s); checking client processes every second instead", exc)
                self._use_pidfd = False
        self._watched[pid] = fd
        if fd is not None:
            asyncio.get_running_loop().add_reader(fd, self._exited, pid)
        return True

    def sweep(self) -> None:
        """Report the processes without a pidfd that are gone (call about once a second)."""
        for pid in [pid for pid, fd in self._watched.items() if fd is None]:
            if not _alive(pid):
                self._exited(pid)

    def close(self) -> None:
        for pid in list(self._watched):
            self._forget(pid)

    def _exited(self, pid: int) -> None:
        if pid in self._watched:
            self._forget(pid)
            self._on_exit(pid)

    def _forget(self, pid: int) -> None:
        fd = self._watched.pop(pid)
        if fd is not None:
            with contextlib.suppress(ValueError, RuntimeError):  # the loop may be closing
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


def _alive(pid: int) -> bool:
    """Whether `pid` is a running process: False only on proof that it exited."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")
