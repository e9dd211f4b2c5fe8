"""Socket discovery: SHARDCACHE_SOCKET, then the system daemon's socket when it exists, then the per-user one.

The system socket path is injected (`system_socket=`) so the tests never touch /run.

A trainer outside the daemon's group (docs/deploy.md: the socket's directory is mode 0750, group
`shardcache`) is built for real: a directory of another group, and the check run in a fresh interpreter that
drops from root to `nobody` before the code under test runs.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import pwd
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.shards import ShardSet
from harness.tools import unavailable
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.discovery import discover


@pytest.fixture
def places(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(system socket path, per-user socket path), neither existing; SHARDCACHE_SOCKET unset."""
    (short_tmp / "run").mkdir()
    (short_tmp / "user").mkdir()
    monkeypatch.delenv("SHARDCACHE_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp / "user"))
    return short_tmp / "run" / "shardcache.sock", short_tmp / "user" / "shardcache.sock"


def read(client: DaemonClient, path: str) -> bytes:
    with client.open(path) as shard:
        return shard.read()


def test_an_existing_system_socket_is_used_before_the_per_user_one(  # type: ignore[no-untyped-def]
    places, daemon_factory, local_shards: ShardSet
) -> None:
    system, _ = places
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], socket_path=system)
    client = DaemonClient(system_socket=str(system), required=True)
    assert client.socket == str(system)
    assert read(client, local_shards.local_paths[0]) == Path(local_shards.local_paths[0]).read_bytes()
    assert client.stats().misses == 1
    daemon.stop()


def test_the_per_user_socket_is_used_when_the_system_socket_is_absent(  # type: ignore[no-untyped-def]
    places, daemon_factory, local_shards: ShardSet
) -> None:
    system, user = places
    daemon_factory(allow=[str(local_shards.local_dir)], socket_path=user)
    client = DaemonClient(system_socket=str(system), required=True)
    assert client.socket == str(user)
    read(client, local_shards.local_paths[0])
    assert client.stats().misses == 1


def test_shardcache_socket_wins_over_an_existing_system_socket(  # type: ignore[no-untyped-def]
    places, daemon_factory, local_shards: ShardSet, short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system, _ = places
    daemon_factory(allow=[str(local_shards.local_dir)], socket_path=system)
    chosen = short_tmp / "chosen.sock"
    monkeypatch.setenv("SHARDCACHE_SOCKET", str(chosen))
    assert DaemonClient(system_socket=str(system)).socket == str(chosen)


def test_the_fallback_warning_names_every_path_tried_and_the_required_argument(  # type: ignore[no-untyped-def]
    places, local_shards: ShardSet, caplog: pytest.LogCaptureFixture
) -> None:
    system, user = places
    caplog.set_level(logging.WARNING, logger="shardcache")
    client = DaemonClient(system_socket=str(system))
    assert read(client, local_shards.local_paths[0]) == Path(local_shards.local_paths[0]).read_bytes()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert str(system) in warning and str(user) in warning
    assert "SHARDCACHE_SOCKET is not set" in warning
    assert 'daemon="required"' in warning and "required=True" not in warning


def test_a_client_that_found_no_socket_finds_a_system_daemon_started_later(  # type: ignore[no-untyped-def]
    places, daemon_factory, local_shards: ShardSet
) -> None:
    system, user = places
    client = DaemonClient(system_socket=str(system), reprobe_interval=0.0)
    path = local_shards.local_paths[0]
    read(client, path)  # nobody answers: read directly
    daemon_factory(allow=[str(local_shards.local_dir)], socket_path=system)
    read(client, path)
    assert client.socket == str(system)
    assert client.stats().misses == 1


def test_discovery_of_nothing_keeps_the_per_user_path_for_a_non_root_user(  # type: ignore[no-untyped-def]
    places, monkeypatch: pytest.MonkeyPatch
) -> None:
    system, user = places
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    found = discover(None, str(system))
    assert found.socket == str(user)
    assert found.tried == (str(system), str(user))
    assert not found.explicit


UNPRIVILEGED = "nobody"

# Imported while still root: this interpreter may live where `nobody` cannot read (e.g. under /root).
_IMPORTS = """
import contextlib, io, json, logging, os, sys
from shardcache import cli
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.discovery import discover
import fsspec.implementations.local
"""
_DROP = """
os.setgroups([int(g) for g in sys.argv[3].split(",") if g])
os.setgid(int(sys.argv[2]))
os.setuid(int(sys.argv[1]))
"""


def as_unprivileged(
    body: str, groups: Sequence[int] = (), warm: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """Run Python `body` as `nobody` (with only `groups` as supplementary groups) in a fresh interpreter.

    The interpreter starts as root, imports (and runs `warm`, to import what a code path imports lazily),
    then drops its user and groups before `body` runs: what a setuid(2) in a preexec_fn would do, for an
    interpreter that `nobody` could not execute.
    """
    user = pwd.getpwnam(UNPRIVILEGED)
    code = _IMPORTS + warm + _DROP + body
    command = [sys.executable, "-c", code, str(user.pw_uid), str(user.pw_gid), ",".join(map(str, groups))]
    base = {k: v for k, v in os.environ.items() if k != "SHARDCACHE_SOCKET"}
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**base, **env})


@dataclass(frozen=True)
class Fence:
    """A system socket in a mode-0750 directory of group `gid` (`group`: its name, or "gid N")."""

    system: Path
    user_dir: Path
    shard: Path
    gid: int
    group: str


def other_named_group() -> grp.struct_group:
    """A named group, not root's, that the unprivileged user is not a member of."""
    user = pwd.getpwnam(UNPRIVILEGED)
    for group in grp.getgrall():
        if group.gr_gid not in (0, user.pw_gid) and user.pw_name not in group.gr_mem:
            return group
    unavailable(f"no group here that {UNPRIVILEGED} is not a member of")


def unnamed_gid() -> int:
    known = {group.gr_gid for group in grp.getgrall()}
    return next(gid for gid in range(40000, 60000) if gid not in known)


@pytest.fixture
def fence(short_tmp: Path) -> Callable[[int], Fence]:
    """Factory: the daemon's socket directory of group `gid`, as docs/deploy.md sets it up."""
    if os.geteuid() != 0:
        unavailable("building a directory of another group and dropping to an unprivileged user needs root")
    try:
        pwd.getpwnam(UNPRIVILEGED)
    except KeyError:
        unavailable(f"no user {UNPRIVILEGED!r} to run the trainer as")

    def build(gid: int) -> Fence:
        short_tmp.chmod(0o755)
        run = short_tmp / "run"
        run.mkdir()
        os.chown(run, 0, gid)
        run.chmod(0o750)
        system = run / "shardcache.sock"
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(system))  # the socket file stays: enough for discovery, which only stats it
        user_dir = short_tmp / "user"
        user_dir.mkdir(mode=0o755)
        shard = short_tmp / "shard.tar"
        shard.write_bytes(b"shard bytes")
        shard.chmod(0o644)
        try:
            name = grp.getgrgid(gid).gr_name
        except KeyError:
            name = f"gid {gid}"
        return Fence(system, user_dir, shard, gid, name)

    return build


def discovered(fenced: Fence, groups: Sequence[int] = ()) -> dict[str, str]:
    """What `discover` tells the unprivileged user: the socket chosen and the paths tried."""
    body = f"found = discover(None, {str(fenced.system)!r})\n"
    body += "print(json.dumps({'socket': found.socket, 'tried': found.describe()}))\n"
    done = as_unprivileged(body, groups, XDG_RUNTIME_DIR=str(fenced.user_dir))
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


def test_a_system_socket_out_of_reach_is_permission_denied_naming_the_directory_group(
    fence: Callable[[int], Fence],
) -> None:
    fenced = fence(other_named_group().gr_gid)
    tried = discovered(fenced)["tried"]
    assert (
        f"{fenced.system} (permission denied: join group {fenced.group}, the group of {fenced.system.parent})"
        in tried
    )
    assert f"{fenced.system} (absent)" not in tried


def test_a_directory_group_without_a_name_is_named_by_its_gid(fence: Callable[[int], Fence]) -> None:
    gid = unnamed_gid()
    fenced = fence(gid)
    assert (
        f"(permission denied: join group gid {gid}, the group of {fenced.system.parent})"
        in discovered(fenced)["tried"]
    )


def test_a_user_outside_the_group_falls_back_to_the_per_user_socket(fence: Callable[[int], Fence]) -> None:
    fenced = fence(other_named_group().gr_gid)
    assert discovered(fenced)["socket"] == str(fenced.user_dir / "shardcache.sock")


def test_a_member_of_the_directory_group_finds_the_system_socket(fence: Callable[[int], Fence]) -> None:
    fenced = fence(other_named_group().gr_gid)
    found = discovered(fenced, groups=[fenced.gid])
    assert found["socket"] == str(fenced.system)
    assert f"{fenced.system} (exists)" in found["tried"]


def test_the_direct_read_warning_outside_the_group_names_the_group_to_join(
    fence: Callable[[int], Fence],
) -> None:
    fenced = fence(other_named_group().gr_gid)
    body = "logging.basicConfig(level=logging.WARNING, format='%(message)s')\n"
    body += f"client = DaemonClient(system_socket={str(fenced.system)!r})\n"
    body += (
        f"with client.open({str(fenced.shard)!r}) as shard:\n    sys.stdout.write(shard.read().decode())\n"
    )
    done = as_unprivileged(body, XDG_RUNTIME_DIR=str(fenced.user_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "shard bytes"
    assert f"{fenced.system} (permission denied: join group {fenced.group}" in done.stderr
    assert f"This user may not reach {fenced.system} (permission denied)" in done.stderr
    assert "Start the daemon" not in done.stderr


def test_shardcache_stats_outside_the_group_says_permission_denied_and_names_the_group(
    fence: Callable[[int], Fence],
) -> None:
    fenced = fence(other_named_group().gr_gid)
    # A first run as root against no socket imports what the command imports on its way to failing.
    warm = "with contextlib.redirect_stderr(io.StringIO()):\n"
    warm += "    cli.main(['stats', '--socket', '/nonexistent.sock'])\n"
    body = f"sys.exit(cli.main(['stats', '--socket', {str(fenced.system)!r}]))\n"
    done = as_unprivileged(body, warm=warm, XDG_RUNTIME_DIR=str(fenced.user_dir))
    assert done.returncode == 1
    assert "permission denied" in done.stderr
    assert f"join group {fenced.group}, the group of {fenced.system.parent}" in done.stderr
    assert "Start shardcached" not in done.stderr
