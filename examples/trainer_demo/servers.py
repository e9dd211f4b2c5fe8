"""The demo's local servers: an S3 endpoint (moto) and `shardcached`, as subprocesses it starts and stops.

Both are polled for readiness with a deadline and stopped with SIGTERM, then SIGKILL. The S3 endpoint uses
moto's documented fake credentials ("testing"), which are only ever sent to that local endpoint.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shardcache.daemon_access.daemon_client import DaemonClient

FAKE_S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MissingDemoDependency(RuntimeError):
    """A package the demo needs is not installed; the message says how to install it."""


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def _wait_until(
    check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, deadline_s: float
) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it became ready")
        if check():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} was not ready within {deadline_s:.0f}s")


def _log_file(log: Path | None) -> IO[bytes] | int:
    return open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child


@dataclass
class S3Server:
    """moto's S3 server on 127.0.0.1."""

    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """Environment that points AWS SDKs (boto3, s3fs, the daemon) at this endpoint."""
        return {
            **FAKE_S3_CREDENTIALS,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def stop(self) -> None:
        _stop(self.process)


def start_s3_server(deadline_s: float = 60.0, log: Path | None = None) -> S3Server:
    """Start moto's S3 server on a free loopback port and wait until it answers."""
    for module in ("moto", "flask", "boto3"):
        if importlib.util.find_spec(module) is None:
            raise MissingDemoDependency(
                f"the demo's local S3 endpoint needs {module}: pip install 'shardcache[demo]' "
                "(or run `make demo`, which installs it), or use your own bucket with --no-local-s3"
            )
    port = free_tcp_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=_log_file(log),
        stderr=subprocess.STDOUT,
        env={**os.environ, **FAKE_S3_CREDENTIALS},
    )
    endpoint = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2) as answer:  # noqa: S310
                return bool(answer.status == 200)
        except OSError:
            return False

    _wait_until(answers, proc, "moto S3 server", deadline_s)
    return S3Server(endpoint, proc)


@dataclass
class Daemon:
    """`shardcached` on a Unix socket, with its metrics listener on loopback."""

    socket: str
    metrics_port: int
    process: subprocess.Popen[bytes]

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def stop(self) -> None:
        _stop(self.process)


def start_daemon(
    socket_path: Path,
    cache_dir: Path,
    allow: Sequence[str],
    *,
    capacity: str,
    metrics_port: int,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    deadline_s: float = 30.0,
) -> Daemon:
    """Start `shardcached` and wait until it answers its health check on `socket_path`."""
    args = [sys.executable, "-m", "shardcached", "--socket", str(socket_path), "--cache-dir", str(cache_dir)]
    args += ["--capacity", capacity, "--metrics-addr", f"127.0.0.1:{metrics_port}"]
    for prefix in allow:
        args += ["--allow", prefix]
    proc = subprocess.Popen(
        args, env={**os.environ, **(env or {})}, stdout=_log_file(log), stderr=subprocess.STDOUT
    )
    daemon = Daemon(str(socket_path), metrics_port, proc)
    probe = DaemonClient(str(socket_path), required=False)
    try:
        _wait_until(probe.available, proc, "shardcached", deadline_s)
    except BaseException:
        daemon.stop()
        raise
    finally:
        probe.close()
    return daemon
