"""The fork-safety rules of `shardcache.forksafe`, each held by a test.

1. A forked DataLoader worker imports nothing: everything its code path uses was imported in the trainer.
2. A fork waits until our background threads are idle (`background_work`), and they wait for the fork.
3. A forked child's ControlClient does not inherit its parent's lock or pooled connections, nor its
   session (the child closes its copy of the parent's session socket and starts its own).
4. The control plane builds no TLS context (it speaks plain HTTP on a Unix socket).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.devservers import Daemon
from harness.pipelines import make_tars
from harness.polling import wait_child
from harness.watchdog import run_watched
from shardcache import forksafe
from shardcache.daemon_access.control import NO_TLS, ControlClient
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.direct import DiskFullMemory
from shardcache.daemon_access.session import session_for

REPO = Path(__file__).resolve().parents[3]
REAL_SSL_CONTEXT = ssl.SSLContext


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon], tmp_path: Path) -> Daemon:
    return daemon_factory([str(tmp_path)])


def test_a_forked_worker_imports_nothing(
    daemon: Daemon, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    make_tars(tmp_path / "shards", 4, 16)
    pattern = str(tmp_path / "shards" / "shard_{000000..000003}.tar")
    record = tmp_path_factory.mktemp("imports")
    command = [sys.executable, "-m", "harness.user_script", "--shards", pattern, "--epochs", "2"]
    command += ["--socket", daemon.socket, "--record-imports", str(record), "--persistent", "false"]
    done = run_watched(command, 120.0, cwd=REPO)
    assert done.returncode == 0, done.stdout
    reports = {path.name: json.loads(path.read_text()) for path in record.glob("*.json")}
    assert len(reports) == 4, done.stdout  # two workers in each of two epochs
    assert all(imported == [] for imported in reports.values()), reports


def test_a_fork_waits_until_background_work_is_done() -> None:
    working, left = threading.Event(), threading.Event()
    left_at: list[float] = []

    def work() -> None:
        with forksafe.background_work():
            working.set()
            left.wait(0.3)  # holds the work open for a while; the fork below must wait for it
            left_at.append(time.monotonic())

    thread = threading.Thread(target=work)
    thread.start()
    assert working.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report when it started, and leave at once
        os.write(write, repr(time.monotonic()).encode())
        os._exit(0)
    os.close(write)
    started = float(os.read(read, 64))
    os.close(read)
    thread.join(10)
    assert wait_child(pid) == 0
    assert started >= left_at[0]


def test_background_work_waits_while_a_fork_happens() -> None:
    forksafe._before_fork()  # what os.fork runs first; held as a fork would hold it
    entered = threading.Event()

    def work() -> None:
        with forksafe.background_work():
            entered.set()

    thread = threading.Thread(target=work)
    thread.start()
    try:
        assert not entered.wait(0.2)
    finally:
        forksafe._after_fork_in_parent()
    assert entered.wait(10)
    thread.join(10)


def fork_while_held(lock: Any, in_child: Callable[[], bool]) -> int:
    """Fork while another thread holds `lock`; the child's exit status is 0 when `in_child()` is True."""
    held, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with lock:  # a thread of the parent in the middle of its work at the fork
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold_lock)
    thread.start()
    assert held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # the child never returns into pytest, whatever happens
            ok = False
            try:
                ok = in_child()
            finally:
                os._exit(0 if ok else 1)
        return wait_child(pid)
    finally:
        release.set()
        thread.join(10)


@pytest.mark.parametrize("kind", ["DaemonClient", "DiskFullMemory"])
def test_a_forked_child_gets_its_own_lock(kind: str, daemon: Daemon) -> None:
    """A lock another thread held at the fork is free in the child (`forksafe.reset_in_child`)."""
    owner: Any = DaemonClient(daemon.socket) if kind == "DaemonClient" else DiskFullMemory()
    name = "_state_lock" if kind == "DaemonClient" else "_lock"
    assert fork_while_held(getattr(owner, name), lambda: bool(getattr(owner, name).acquire(timeout=5))) == 0


def test_a_forked_child_does_not_inherit_the_control_clients_lock(daemon: Daemon) -> None:
    control = ControlClient(daemon.socket, timeout=5.0)
    assert control.request("GET", "/v1/health").status == 200  # a pooled connection in the parent
    assert fork_while_held(control._lock, lambda: control.request("GET", "/v1/health").status == 200) == 0
    assert control.request("GET", "/v1/health").status == 200  # the parent's client still works
    control.close()


def test_a_forked_child_opens_in_its_own_session_even_if_the_parent_s_was_being_started(
    daemon: Daemon, tmp_path: Path
) -> None:
    # A trainer thread starting the process's session (its lock held) while a DataLoader worker forks:
    # the worker does not wait on that lock, and starts a session of its own, not the parent's.
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"x" * 1024)
    client = DaemonClient(daemon.socket, required=True)
    session = session_for(daemon.socket)
    with client.open(str(shard)):
        parent_session = session.current(5.0)

    def child_opens_in_a_new_session() -> bool:
        with client.open(str(shard)):
            return session.current(5.0) not in (None, parent_session)

    assert fork_while_held(session._lock, child_opens_in_a_new_session) == 0
    assert session.current(5.0) == parent_session  # the parent's session lives on
    client.close()


class _NoTLSAllowed(ssl.SSLContext):
    def __new__(cls, *args: Any, **kwargs: Any) -> _NoTLSAllowed:
        raise AssertionError("the control plane built a TLS context")


@pytest.fixture
def no_tls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(ssl, "SSLContext", _NoTLSAllowed)
    monkeypatch.setattr(ssl, "create_default_context", _NoTLSAllowed)
    yield


def test_the_control_plane_builds_no_tls_context(daemon: Daemon, no_tls: None) -> None:
    control = ControlClient(daemon.socket, timeout=5.0)
    try:
        assert control.request("GET", "/v1/health").status == 200
    finally:
        control.close()
    assert isinstance(NO_TLS, REAL_SSL_CONTEXT)  # the one context httpx gets, built at import
