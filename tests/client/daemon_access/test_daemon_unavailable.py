"""`DaemonUnavailable` carries the socket and why it failed; the CLI prints them with its own advice, and
only the Python-facing message of a `required` client names the Python arguments."""

from __future__ import annotations

import pickle
import socket
from pathlib import Path

import pytest

from shardcache import cli
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import DaemonUnavailable


def stale_socket(directory: Path) -> str:
    """A socket file nobody listens on (a daemon that was killed): connecting is refused."""
    path = str(directory / "stale.sock")
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(path)
    return path


def test_the_error_carries_the_socket_and_the_reason(short_tmp: Path) -> None:
    missing = str(short_tmp / "absent.sock")
    with DaemonClient(missing) as client, pytest.raises(DaemonUnavailable) as caught:
        client.stats()
    assert (caught.value.socket, caught.value.reason) == (missing, "the socket does not exist")
    assert "daemon=" not in str(caught.value)


def test_a_required_client_names_the_reason_and_the_daemon_arguments(short_tmp: Path) -> None:
    refused = stale_socket(short_tmp)
    with (
        DaemonClient(refused, required=True, restart_wait_s=0) as client,
        pytest.raises(DaemonUnavailable) as caught,
        client.open("/data/shard.tar"),
    ):
        pass
    assert caught.value.reason.startswith("connection refused (the daemon is not running)")
    assert 'daemon="auto"' in str(caught.value) and "daemon=None" in str(caught.value)


def test_the_error_survives_pickling(short_tmp: Path) -> None:
    error = DaemonUnavailable(str(short_tmp / "x.sock"), "the socket does not exist")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.socket, copy.reason, str(copy)) == (error.socket, error.reason, str(error))


def test_the_cli_prints_the_socket_and_the_reason_without_python_advice(
    short_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = stale_socket(short_tmp)
    assert cli.main(["stats", "--socket", refused]) == 1
    err = capsys.readouterr().err
    assert f"no shardcached daemon answers on {refused} (connection refused" in err
    assert "--socket PATH" in err and "SHARDCACHE_SOCKET" in err
    assert "daemon=" not in err
