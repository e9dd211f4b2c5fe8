"""Which Unix socket a trainer uses to reach the node daemon when none is configured.

The order, first match wins:

1. `SHARDCACHE_SOCKET`, when set: an explicit choice, used whether or not the socket exists yet.
2. The system daemon's socket, `/run/shardcache/shardcache.sock` (systemd unit, DaemonSet hostPath), when it
   exists.
3. The per-user socket: `$XDG_RUNTIME_DIR/shardcache.sock`, else `/tmp/shardcache-<uid>/shardcache.sock`
   (a daemon a user started for themselves).

A trainer that finds no socket at all uses the per-user path (the system path for root) and keeps looking:
`DaemonClient` searches again each time it re-probes a daemon that did not answer, so a daemon started after
the trainer is found. The warning of a trainer that reads directly names every path it tried, and for a path
this user may not reach (the system socket's directory is mode 0750, group `shardcache`), the group to join.
"""

from __future__ import annotations

import grp
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from shardcache_protocol import ROOT_SOCKET_PATH, SOCKET_ENV, SOCKET_NAME

SYSTEM_SOCKET = ROOT_SOCKET_PATH


def user_socket_path() -> str:
    """The per-user socket: `$XDG_RUNTIME_DIR/shardcache.sock`, else `/tmp/shardcache-<uid>/...`."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return str(Path(runtime_dir) / SOCKET_NAME)
    return f"/tmp/shardcache-{os.geteuid()}/{SOCKET_NAME}"


def is_socket(path: str) -> bool:
    """Whether `path` exists and is a Unix socket (a stale one left by a killed daemon counts)."""
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


@dataclass(frozen=True)
class Denied:
    """A socket path this user may not reach: `directory` keeps it out, and members of its group get in."""

    directory: str
    group: str  # the group's name, or "gid N" when it has none here

    def advice(self) -> str:
        """What to do, for messages: "join group shardcache, the group of /run/shardcache"."""
        return f"join group {self.group}, the group of {self.directory}"


def denied(path: str) -> Denied | None:
    """Why this user may not reach `path` (permission denied), else None (it exists, or it is absent).

    The directory that keeps it out is the nearest one this user can still stat: it may not search it.
    """
    try:
        os.stat(path)
        return None
    except PermissionError:
        pass
    except OSError:
        return None
    for directory in Path(path).parents:
        try:
            gid = os.stat(directory).st_gid
        except OSError:
            continue
        try:
            group = grp.getgrgid(gid).gr_name
        except KeyError:
            group = f"gid {gid}"
        return Denied(str(directory), group)
    return None


def path_state(path: str) -> str:
    """How a socket path looks to this user, for messages: "exists", "absent" or "permission denied: ..."."""
    if is_socket(path):
        return "exists"
    refused = denied(path)
    return "absent" if refused is None else f"permission denied: {refused.advice()}"


@dataclass(frozen=True)
class Discovery:
    """The socket chosen and how: `explicit` (argument or `SHARDCACHE_SOCKET`) or searched among `tried`."""

    socket: str
    tried: tuple[str, ...]
    explicit: bool

    def describe(self) -> str:
        """The paths tried, for messages: "SHARDCACHE_SOCKET=/x" or "/run/... (absent), /run/user/...".

        A path this user may not reach says so and names the group to join: "/run/shardcache/shardcache.sock
        (permission denied: join group shardcache, the group of /run/shardcache)".
        """
        if self.explicit:
            from_env = os.environ.get(SOCKET_ENV)
            return f"{SOCKET_ENV}={self.socket}" if from_env == self.socket else self.socket
        shown = [f"{path} ({path_state(path)})" for path in self.tried]
        return f"{', '.join(shown)}; {SOCKET_ENV} is not set"

    def unreachable(self) -> list[tuple[str, Denied]]:
        """The paths tried that this user may not reach, with why (see `denied`)."""
        return [(path, refused) for path in self.tried if (refused := denied(path)) is not None]

    def join_advice(self) -> str | None:
        """What to do when a socket tried is out of this user's reach (None when none is): join its group."""
        unreachable = self.unreachable()
        if not unreachable:
            return None
        path, refused = unreachable[0]
        return f"This user may not reach {path} (permission denied): {refused.advice()}, then log in again."


def discover(socket: str | None = None, system_socket: str = SYSTEM_SOCKET) -> Discovery:
    """The socket to use: `socket` when given, else the search of the module docstring.

    Args:
        socket: An explicit socket path (wins over everything).
        system_socket: The system daemon's socket (injectable so tests need not write to /run).
    """
    if socket:
        return Discovery(socket, (socket,), explicit=True)
    from_env = os.environ.get(SOCKET_ENV)
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
