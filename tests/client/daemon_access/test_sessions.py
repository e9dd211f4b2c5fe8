"""A client process holds one session, and its leases end with the process, not with any connection.

Real daemon, real `DaemonClient`, real forks and threads. The session's connection is the one the daemon
watches (tests/daemon/test_sessions.py holds the wire); these tests hold the client to its rules: one
session per process, shared by its clients and outliving each of them, never shared with a forked child,
replaced after a daemon restart, and none with a daemon that has no sessions.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.polling import wait_child, wait_for
from harness.shards import ShardSet
from shardcache import forksafe
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.session import Session
from shardcache_protocol import SESSIONS_PATH


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon], local_shards: ShardSet) -> Daemon:
    return daemon_factory(allow=[str(local_shards.local_dir)])


def stats(daemon: Daemon) -> dict[str, Any]:
    with api(daemon) as http:
        answer: dict[str, Any] = http.get("/v1/stats").json()
    return answer


def daemon_sockets(daemon: Daemon) -> int:
    """How many sockets the daemon process has open (its listeners and its client connections)."""
    fds = Path(f"/proc/{daemon.process.pid}/fd")
    return sum(os.readlink(fds / fd).startswith("socket:") for fd in os.listdir(fds))


def test_a_client_opens_under_one_session_whatever_the_thread(daemon: Daemon, local_shards: ShardSet) -> None:
    paths = local_shards.local_paths
    with DaemonClient(daemon.socket, required=True) as client, contextlib.ExitStack() as held:
        plan = client.register_plan("job", 0, 0, paths)
        held.enter_context(client.open(paths[0], plan=plan))
        worker = threading.Thread(target=lambda: held.enter_context(client.open(paths[1])))
        worker.start()
        worker.join(30)
        assert (stats(daemon)["sessions"], stats(daemon)["leases"]) == (1, 2)


def test_a_keep_alive_connection_closing_and_another_opening_leave_the_leases_in_place(
    daemon: Daemon, local_shards: ShardSet
) -> None:
    # A thread opens a shard and ends: its keep-alive connection closes with it, while the shard, handed to
    # another thread, stays open; then that thread opens on a connection of its own. The daemon must see
    # neither as a holder's death.
    paths = local_shards.local_paths
    with (
        DaemonClient(daemon.socket, required=True) as client,
        contextlib.ExitStack() as held,
        api(daemon) as http,
    ):
        http.get("/v1/stats")  # this connection stays open throughout: only the thread's goes
        counted: list[int] = []

        def open_and_end() -> None:
            held.enter_context(client.open(paths[0]))
            counted.append(daemon_sockets(daemon))

        opener = threading.Thread(target=open_and_end)
        opener.start()
        opener.join(30)
        wait_for(
            lambda: daemon_sockets(daemon) < counted[0], "the daemon to close the ended thread's connection"
        )
        held.enter_context(client.open(paths[1]))
        assert (http.get("/v1/stats").json()["leases"], http.get("/v1/stats").json()["sessions"]) == (2, 1)


def test_every_client_of_a_process_opens_in_its_one_session_which_outlives_them(
    daemon: Daemon, local_shards: ShardSet
) -> None:
    # A source makes a client per pass over the data and closes it at the end of the pass; the plans it
    # registered (the next epoch's) and the process's other clients must not end with it.
    paths = local_shards.local_paths
    first, second = DaemonClient(daemon.socket, required=True), DaemonClient(daemon.socket, required=True)
    with first.open(paths[0]), second.open(paths[1]):
        assert (stats(daemon)["sessions"], stats(daemon)["leases"]) == (1, 2)
    first.close()
    second.close()
    with DaemonClient(daemon.socket, required=True) as third, third.open(paths[2]):
        assert (stats(daemon)["sessions"], stats(daemon)["leases"]) == (1, 1)
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 0


TRAINER_THROUGH_A_RESTART = textwrap.dedent(
    """
    import os, sys, time
    from shardcache import DaemonClient
    socket, steps, first, second = sys.argv[1:]
    def step(name):
        with open(os.path.join(steps, name + ".tmp"), "w"):
            pass
        os.replace(os.path.join(steps, name + ".tmp"), os.path.join(steps, name))
    client = DaemonClient(socket, required=True)
    with client.open(first):
        step("first")
        while not os.path.exists(os.path.join(steps, "restarted")):
            time.sleep(0.02)  # the test restarts the daemon meanwhile
        with client.open(second):
            step("second")
            time.sleep(600)
    """
)


def test_a_trainer_that_lived_through_a_daemon_restart_is_released_by_the_new_daemon_when_killed(
    daemon_factory: Callable[..., Daemon], local_shards: ShardSet, short_tmp: Path, tmp_path: Path
) -> None:
    # The old daemon's session is gone with it; the trainer's next open names it, is refused (404
    # unknown_session), starts a session with the new daemon and opens again in it.
    socket_path, cache, steps = short_tmp / "restarted.sock", tmp_path / "restarted-cache", tmp_path / "steps"
    steps.mkdir()
    allow = [str(local_shards.local_dir)]
    first = daemon_factory(allow=allow, socket_path=socket_path, cache_dir=cache)
    shards = local_shards.local_paths[:2]
    command = [sys.executable, "-c", TRAINER_THROUGH_A_RESTART, str(socket_path), str(steps), *shards]
    trainer = subprocess.Popen(command, start_new_session=True)
    try:
        wait_for(lambda: (steps / "first").exists() or trainer.poll() is not None, "the first open", 60)
        assert first.stop() == 0
        second = daemon_factory(allow=allow, socket_path=socket_path, cache_dir=cache)
        (steps / "restarted").touch()
        wait_for(lambda: (steps / "second").exists() or trainer.poll() is not None, "the second open", 60)
        assert trainer.poll() is None, "the trainer failed"
        assert (stats(second)["sessions"], stats(second)["leases"]) == (1, 1)
        trainer.kill()
        wait_for(lambda: stats(second)["leases"] == 0, "the killed trainer's lease to end", 5)
        assert metric(second, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 1
    finally:
        if trainer.poll() is None:
            trainer.kill()
        trainer.wait(30)


def test_a_forked_child_opens_in_a_session_of_its_own_whose_end_leaves_the_parent_s_leases(
    daemon: Daemon, local_shards: ShardSet
) -> None:
    paths = local_shards.local_paths
    with DaemonClient(daemon.socket, required=True) as client, client.open(paths[0]):
        held, leave = os.pipe(), os.pipe()
        pid = os.fork()
        if pid == 0:  # a DataLoader worker: opens through the client it inherited, then exits
            try:
                with client.open(paths[1]):
                    os.write(held[1], b"held")
                    os.read(leave[0], 1)
            finally:
                os._exit(0)
        assert os.read(held[0], 4) == b"held"
        assert (stats(daemon)["sessions"], stats(daemon)["leases"]) == (2, 2)
        os.write(leave[1], b"x")
        assert wait_child(pid) == 0
        wait_for(lambda: stats(daemon)["sessions"] == 1, "the child's session to end with it")
        assert stats(daemon)["leases"] == 1  # the parent's, in the parent's session
        for fd in (*held, *leave):
            os.close(fd)


TRAINER_WITH_A_WORKER = textwrap.dedent(
    """
    import os, sys, time
    from shardcache import DaemonClient
    client = DaemonClient(sys.argv[1], required=True)
    with client.open(sys.argv[3]):
        child = os.fork()
        if child == 0:  # a worker that outlives the trainer for a while (it checks its parent now and then)
            time.sleep(600)
            os._exit(0)
        with open(sys.argv[2] + ".tmp", "w") as ready:
            ready.write(str(child))
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
        time.sleep(600)
    """
)


def test_a_trainer_killed_alone_is_released_while_its_forked_worker_lives_on(
    daemon: Daemon, local_shards: ShardSet, tmp_path: Path
) -> None:
    # The worker inherited a copy of the trainer's session socket at the fork and closed it: the trainer's
    # death alone closes the session's connection.
    ready = tmp_path / "ready"
    command = [
        sys.executable,
        "-c",
        TRAINER_WITH_A_WORKER,
        daemon.socket,
        str(ready),
        local_shards.local_paths[0],
    ]
    trainer = subprocess.Popen(command, start_new_session=True)
    try:
        wait_for(lambda: ready.exists() or trainer.poll() is not None, "the trainer to hold its shard", 60)
        worker = int(ready.read_text())
        assert stats(daemon)["leases"] == 1
        trainer.kill()
        trainer.wait(30)
        wait_for(lambda: stats(daemon)["leases"] == 0, "the killed trainer's lease to end", 5)
        os.kill(worker, 0)  # still alive, holding the copy of the socket it did not close
    finally:
        with contextlib.suppress(ProcessLookupError):  # the worker left with the trainer's group
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait(30)


class OldDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A daemon from before sessions: no `POST /v1/sessions` (404), and its open request model forbids
    unknown fields (422 for `session`). It grants `grant_path` for every open and records each request."""

    daemon_threads = True

    def __init__(self, path: str, grant_path: str) -> None:
        self.grant_path = grant_path
        self.requests: list[tuple[str, dict[str, Any]]] = []
        super().__init__(path, _OldHandler)


class _OldHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        server = self.server
        assert isinstance(server, OldDaemon)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        server.requests.append((self.path, body))
        status, answer = 404, {"error": "not_found", "detail": "Not Found"}
        if self.path == "/v1/shards/open" and "session" in body:
            status, answer = (
                422,
                {"error": "invalid_request", "detail": "session: Extra inputs are not permitted"},
            )
        elif self.path == "/v1/shards/open":
            grant = {"url": body["url"], "path": server.grant_path, "size": 1, "lease": "l1", "hit": True}
            status, answer = 200, grant
        elif self.path == "/v1/shards/release":
            status, answer = 204, {}
        payload = json.dumps(answer).encode() if status != 204 else b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture
def old_daemon(short_tmp: Path, local_shards: ShardSet) -> Iterator[OldDaemon]:
    server = OldDaemon(str(short_tmp / "old.sock"), local_shards.local_paths[0])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_daemon_without_sessions_is_asked_once_and_gets_opens_that_name_none(
    old_daemon: OldDaemon, local_shards: ShardSet
) -> None:
    with DaemonClient(str(old_daemon.server_address), required=True) as client:
        for url in local_shards.local_paths:
            with client.open(url) as handle:
                assert handle.read() == Path(local_shards.local_paths[0]).read_bytes()
    asked = [path for path, _ in old_daemon.requests if path == SESSIONS_PATH]
    opens = [body for path, body in old_daemon.requests if path == "/v1/shards/open"]
    assert len(asked) == 1 and len(opens) == len(local_shards.local_paths)
    assert all("session" not in body for body in opens)


def test_a_thread_starting_the_session_and_a_background_thread_losing_it_do_not_deadlock(
    daemon: Daemon,
) -> None:
    # What hung a DataLoader worker after a daemon restart: its plan thread, inside the fork lock
    # (`forksafe.background_work`) for its whole registration, found the session gone (`lost` takes the
    # session's lock) while the worker's main thread was starting a new one.
    session = Session(daemon.socket)
    inside, lose = threading.Event(), threading.Event()

    def announce_ahead() -> None:
        with forksafe.background_work():
            inside.set()
            lose.wait(30)
            session.lost("the id a restarted daemon forgot")

    announcer = threading.Thread(target=announce_ahead, daemon=True)
    announcer.start()
    assert inside.wait(30)
    started: list[str | None] = []
    starter = threading.Thread(target=lambda: started.append(session.current(timeout=10)), daemon=True)
    starter.start()
    # Give the starter the chance to take the session's lock first, as it did when it hung (it never
    # does now: it waits for the fork lock before the session's).
    deadline = time.monotonic() + 1.0
    while not session._lock.locked() and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    lose.set()
    announcer.join(30)
    starter.join(30)
    assert not announcer.is_alive() and not starter.is_alive(), "deadlocked"
    assert started and started[0] is not None
