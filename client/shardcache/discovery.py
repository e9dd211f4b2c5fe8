"""Which Unix socket a trainer uses to reach the node daemon when none is configured.

The order, first match wins:

1. `SHARDCACHE_SOCKET`, when set: an explicit choice, used whether or not the socket exists yet.
2. The system daemon's socket, `/run/shardcache/shardcache.sock` (systemd unit, DaemonSet hostPath), when it
   exists.
3. The per-user socket: `$XDG_RUNTIME_DIR/shardcache.sock`, else `/tmp/shardcache-<uid>/shardcache.sock`
   (a daemon a user started for themselves).

A trainer that finds no socket at all uses the per-user path (the system path for root) and keeps looking:
`DaemonClient` searches again each time it re-probes a daemon that did not answer, so a daemon started after
the trainer is found. The warning of a trainer that reads directly names every path it tried.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from shardcache import protocol

SYSTEM_SOCKET = protocol.ROOT_SOCKET_PATH


def user_socket_path() -> str:
    """The per-user socket: `$XDG_RUNTIME_DIR/shardcache.sock`, else `/tmp/shardcache-<uid>/...`."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return str(Path(runtime_dir) / protocol.SOCKET_NAME)
    return f"/tmp/shardcache-{os.geteuid()}/{protocol.SOCKET_NAME}"


def is_socket(path: str) -> bool:
    """Whether `path` exists and is a Unix socket (a stale one left by a killed daemon counts)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


@dataclass(frozen=True)
class Discovery:
    """The socket chosen and how: `explicit` (argument or `SHARDCACHE_SOCKET`) or searched among `tried`."""

    socket: str
    tried: tuple[str, ...]
    explicit: bool

    def describe(self) -> str:
        """The paths tried, for messages: "SHARDCACHE_SOCKET=/x" or "/run/... (absent), /run/user/..."."""
        if self.explicit:
            from_env = os.environ.get(protocol.SOCKET_ENV)
            return f"{protocol.SOCKET_ENV}={self.socket}" if from_env == self.socket else self.socket
        shown = [f"{path} ({'exists' if is_socket(path) else 'absent'})" for path in self.tried]
        return f"{', '.join(shown)}; {protocol.SOCKET_ENV} is not set"


def discover(socket: str | None = None, system_socket: str = SYSTEM_SOCKET) -> Discovery:
    """The socket to use: `socket` when given, else the search of the module docstring.

    Args:
        socket: An explicit socket path (wins over everything).
        system_socket: The system daemon's socket (injectable so tests need not write to /run).
    """
    if socket:
        return Discovery(socket, (socket,), explicit=True)
    from_env = os.environ.get(protocol.SOCKET_ENV)
    if from_env:
        return Discovery(from_env, (from_env,), explicit=True)
    user = user_socket_path()
    tried = (system_socket, user) if user != system_socket else (system_socket,)
    for path in tried:
        if is_socket(path):
            return Discovery(path, tried, explicit=False)
    fallback = system_socket if os.geteuid() == 0 else user
    return Discovery(fallback, tried, explicit=False)


def rediscover(current: Discovery, system_socket: str = SYSTEM_SOCKET) -> Discovery:
    """Search again after the daemon stopped answering; keeps the current socket when none exists."""
    if current.explicit:
        return current
    found = discover(None, system_socket)
    return found if is_socket(found.socket) else current
