"""Local servers for the tests and the benchmarks: an S3 endpoint (moto) and a daemon, as subprocesses.

Both are real processes on loopback or a Unix socket, started and polled for readiness with a deadline, and
stopped with SIGTERM (then SIGKILL). The credentials below are moto's test credentials; nothing here is
shipped in the wheel or needed in production.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

S3_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._unix_path)
        self.sock = sock


def _http_ok(conn: http.client.HTTPConnection, path: str) -> bool:
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


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


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


@dataclass
class S3Server:
    """A moto S3 server subprocess on 127.0.0.1."""

    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """Environment that points AWS SDKs (boto3, s3fs, the daemon) at this endpoint."""
        return {
            **S3_TEST_CREDENTIALS,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def stop(self) -> None:
        stop_process(self.process)


def start_s3_server(deadline_s: float = 60.0, log: Path | None = None) -> S3Server:
    """Start moto's server (as s3fs's own tests do) on a free loopback port and wait until it answers."""
    port = free_tcp_port()
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, **S3_TEST_CREDENTIALS},
    )
    _wait_until(
        lambda: _http_ok(http.client.HTTPConnection("127.0.0.1", port, timeout=2), "/moto-api/"),
        proc,
        "moto S3 server",
        deadline_s,
    )
    return S3Server(endpoint=f"http://127.0.0.1:{port}", process=proc)


@dataclass
class Daemon:
    """A shardcached subprocess on a Unix socket, with its metrics listener on loopback."""

    socket: str
    cache_dir: Path
    metrics_port: int
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def healthy(self) -> bool:
        return _http_ok(_UnixHTTPConnection(self.socket, timeout=2), "/v1/health")

    def stop(self, timeout: float = 15.0) -> int:
        stop_process(self.process, timeout)
        return self.process.returncode

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


def start_daemon(
    socket_path: str | Path,
    cache_dir: str | Path,
    allow: Sequence[str],
    *,
    capacity: str = "1GiB",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    metrics_port: int | None = None,
    deadline_s: float = 30.0,
    log: Path | None = None,
    wrapper: Sequence[str] = (),
    reach_at: str | Path | None = None,
) -> Daemon:
    """Start `shardcached` as a subprocess and wait until `/v1/health` answers on its socket.

    `wrapper` prefixes the command (e.g. `unshare --pid --fork` to run the daemon in its own PID namespace).
    `reach_at`: where this process reaches the socket when the daemon's mount namespace shows it at
    `socket_path` but this one elsewhere (a bind-mounted socket directory); `Daemon.socket` is this path.
    """
    port = metrics_port or free_tcp_port()
    args = [
        *wrapper,
        sys.executable,
        "-m",
        "shardcached",
        "--socket",
        str(socket_path),
        "--cache-dir",
        str(cache_dir),
        "--capacity",
        capacity,
        "--metrics-addr",
        f"127.0.0.1:{port}",
    ]
    for prefix in allow:
        args += ["--allow", prefix]
    args += list(extra_args)
    full_env = {**os.environ, **(env or {})}
    out = open(log, "ab") if log else None  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(args, env=full_env, stdout=out, stderr=subprocess.STDOUT if out else None)
    daemon = Daemon(str(reach_at or socket_path), Path(cache_dir), port, proc, args, dict(env or {}))
    try:
        _wait_until(daemon.healthy, proc, "shardcached", deadline_s)
    except BaseException:
        with contextlib.suppress(Exception):
            daemon.kill()
        raise
    return daemon
