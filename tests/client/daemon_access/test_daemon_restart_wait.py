"""A daemon that stops after answering is waited for (`restart_wait_s`), then read around or reported.

The three-restarts-in-an-epoch test with a throttled remote is in tests/hardening/test_graceful_restart.py.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import ConfigError, DaemonUnavailable


def read(client: DaemonClient, path: str) -> bytes:
    with client.open(path) as shard:
        return shard.read()


def test_an_auto_client_reads_directly_when_the_daemon_does_not_come_back_in_time(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards: ShardSet, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = DaemonClient(daemon.socket, restart_wait_s=0.3)
    path = local_shards.local_paths[0]
    read(client, path)
    daemon.stop()
    caplog.set_level(logging.WARNING, logger="shardcache")
    assert read(client, path) == Path(path).read_bytes()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "did not come back within 0.3s" in warning


def test_a_required_client_raises_when_the_daemon_does_not_come_back_in_time(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards: ShardSet
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = DaemonClient(daemon.socket, required=True, restart_wait_s=0.3)
    read(client, local_shards.local_paths[0])
    daemon.stop()
    with pytest.raises(DaemonUnavailable, match=r"did not come back within 0\.3s.*restart_wait_s"):
        read(client, local_shards.local_paths[1])


def test_an_auto_client_reads_through_a_daemon_that_comes_back(  # type: ignore[no-untyped-def]
    daemon_factory, local_shards: ShardSet, tmp_path: Path
) -> None:
    allow = [str(local_shards.local_dir)]
    daemon = daemon_factory(allow=allow)
    client = DaemonClient(daemon.socket, restart_wait_s=60)
    read(client, local_shards.local_paths[0])
    daemon.stop()
    restarted: list[object] = []
    again = threading.Thread(
        target=lambda: restarted.append(
            daemon_factory(allow=allow, socket_path=Path(daemon.socket), cache_dir=tmp_path / "fresh")
        )
    )
    again.start()  # the open below finds no socket and waits for this daemon
    path = local_shards.local_paths[1]
    assert read(client, path) == Path(path).read_bytes()
    again.join()
    assert client.stats().misses == 1  # the restarted daemon (an empty cache) served it


def test_an_auto_client_that_never_reached_a_daemon_does_not_wait(
    local_shards: ShardSet, short_tmp: Path
) -> None:
    client = DaemonClient(str(short_tmp / "absent.sock"), restart_wait_s=3600)
    path = local_shards.local_paths[0]
    assert read(client, path) == Path(path).read_bytes()


def test_a_negative_restart_wait_is_refused() -> None:
    with pytest.raises(ConfigError, match="restart_wait_s"):
        DaemonClient("/tmp/x.sock", restart_wait_s=-1)


def test_the_restart_wait_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_RESTART_WAIT_S", "120")
    assert DaemonClient("/tmp/x.sock").restart_wait_s == 120
    assert DaemonClient("/tmp/x.sock", restart_wait_s=5).restart_wait_s == 5


def test_a_malformed_restart_wait_in_the_environment_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_RESTART_WAIT_S", "soon")
    with pytest.raises(ConfigError, match="SHARDCACHE_RESTART_WAIT_S=soon"):
        DaemonClient("/tmp/x.sock")
