"""Socket discovery: SHARDCACHE_SOCKET, then the system daemon's socket when it exists, then the per-user one.

The system socket path is injected (`system_socket=`) so the tests never touch /run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardcache.daemon_client import DaemonClient
from shardcache.discovery import discover
from tests.support.shards import ShardSet


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
