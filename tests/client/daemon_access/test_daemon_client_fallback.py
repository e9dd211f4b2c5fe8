"""DaemonClient without a daemon: direct reads with one warning, or an error when the daemon is required."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.direct import local_path_of, open_direct
from shardcache.errors import ConfigError, DaemonUnavailable


@pytest.fixture
def missing_socket(short_tmp: Path) -> str:
    return str(short_tmp / "nobody.sock")


def test_no_daemon_reads_local_shards_directly(missing_socket: str, local_shards: ShardSet) -> None:
    with DaemonClient(missing_socket) as client:
        for path in local_shards.local_paths:
            with client.open(path) as shard:
                assert shard.read() == Path(path).read_bytes()


def test_no_daemon_logs_exactly_one_warning(
    missing_socket: str, local_shards: ShardSet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shardcache")
    with DaemonClient(missing_socket) as client:
        for path in local_shards.local_paths * 3:
            with client.open(path) as shard:
                shard.read(1)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert missing_socket in warnings[0].getMessage()


def test_no_daemon_reads_file_urls_directly(missing_socket: str, local_shards: ShardSet) -> None:
    path = local_shards.local_paths[0]
    with DaemonClient(missing_socket) as client, client.open(f"file://{path}") as shard:
        assert shard.read() == Path(path).read_bytes()


def test_no_daemon_reads_s3_urls_with_fsspec(missing_socket: str, make_bucket) -> None:
    shards = make_bucket(count=1)
    with DaemonClient(missing_socket) as client, client.open(shards.s3_urls[0]) as shard:
        assert shard.read() == Path(shards.local_paths[0]).read_bytes()


def test_required_client_raises_daemon_unavailable_naming_the_socket(missing_socket: str) -> None:
    with DaemonClient(missing_socket, required=True, restart_wait_s=0.2) as client:
        with pytest.raises(DaemonUnavailable, match=missing_socket):
            with client.open("/data/shard.tar"):
                pass


def test_control_plane_raises_daemon_unavailable_without_daemon(missing_socket: str) -> None:
    with DaemonClient(missing_socket) as client:
        with pytest.raises(DaemonUnavailable, match=missing_socket):
            client.stats()


def test_register_plan_without_daemon_returns_none(missing_socket: str) -> None:
    with DaemonClient(missing_socket) as client:
        assert client.register_plan("job", 0, 0, ["/data/a.tar"]) is None
        client.delete_plan("no-such-plan")  # quiet


def test_available_is_false_without_daemon(missing_socket: str) -> None:
    assert DaemonClient(missing_socket).available() is False


def test_socket_comes_from_environment(monkeypatch: pytest.MonkeyPatch, missing_socket: str) -> None:
    monkeypatch.setenv("SHARDCACHE_SOCKET", missing_socket)
    assert DaemonClient().socket == missing_socket


def test_socket_argument_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDCACHE_SOCKET", "/tmp/from-env.sock")
    assert DaemonClient("/tmp/from-arg.sock").socket == "/tmp/from-arg.sock"


def test_unknown_handoff_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="handoff"):
        DaemonClient("/tmp/x.sock", handoff="mmap")  # type: ignore[arg-type]


def test_pickled_client_keeps_its_settings(missing_socket: str) -> None:
    client = DaemonClient(missing_socket, required=True, timeout=5.0, handoff="stream")
    copy = pickle.loads(pickle.dumps(client))
    assert (copy.socket, copy.required, copy.timeout, copy.handoff) == (missing_socket, True, 5.0, "stream")


def test_local_path_of_file_url_decodes_percent_escapes() -> None:
    assert local_path_of("file:///data/my%20shard.tar") == "/data/my shard.tar"
    assert local_path_of("/data/a.tar") == "/data/a.tar"
    assert local_path_of("s3://bucket/a.tar") is None


def test_direct_open_of_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.tar"
    with pytest.raises(FileNotFoundError, match="missing.tar"):
        open_direct(str(missing))
