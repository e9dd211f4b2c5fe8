"""Sessions on the wire: what a request naming a session takes ends when that session's connection closes,
and only then.

Real daemon; sessions are made by hand here (a raw socket that sends `POST /v1/sessions` and keeps the
connection), so each test decides exactly which connection closes when. The client's own use of sessions
is tested in tests/client/daemon_access/test_sessions.py.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.polling import wait_for
from harness.shards import make_tar_shard
from shardcache_protocol import SESSIONS_PATH, SessionGrant


class RawSession:
    """A session held on a socket of its own, as a client process holds it."""

    def __init__(self, daemon: Daemon, body: bytes = b"{}") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(daemon.socket)
        head = f"POST {SESSIONS_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        self.sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        self.answer = http.client.HTTPResponse(self.sock)
        self.answer.begin()
        self.status = self.answer.status
        self.grant = SessionGrant.model_validate_json(self.answer.readline()) if self.status == 200 else None

    @property
    def id(self) -> str:
        assert self.grant is not None
        return self.grant.session

    def close(self) -> None:
        self.answer.close()
        self.sock.close()


@pytest.fixture
def shard(tmp_path: Path) -> str:
    path = tmp_path / "tars" / "shard_000000.tar"
    path.parent.mkdir()
    make_tar_shard(path, 0, samples=2, payload_bytes=1024)
    return str(path)


@pytest.fixture
def daemon(daemon_factory: Callable[..., Daemon], shard: str) -> Daemon:
    return daemon_factory(allow=[str(Path(shard).parent)])


@pytest.fixture
def session(daemon: Daemon) -> Iterator[RawSession]:
    held = RawSession(daemon, json.dumps({"pid": 7, "host": "trainer-0"}).encode())
    yield held
    held.close()


def stats(daemon: Daemon) -> dict[str, object]:
    with api(daemon) as http:
        answer: dict[str, object] = http.get("/v1/stats").json()
    return answer


def test_a_session_s_leases_and_plans_end_when_its_connection_closes(
    daemon: Daemon, shard: str, session: RawSession
) -> None:
    with api(daemon) as http:
        plan = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": [shard], "session": session.id}
        )
        http.post("/v1/shards/open", json={"url": shard, "plan": plan.json()["plan"], "session": session.id})
        http.post("/v1/shards/open", json={"url": shard, "session": session.id}).raise_for_status()
    assert (stats(daemon)["leases"], stats(daemon)["sessions"]) == (2, 1)

    session.close()
    wait_for(lambda: stats(daemon)["leases"] == 0, "the closed session's leases to end")
    assert stats(daemon)["sessions"] == 0
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 2
    wait_for(lambda: stats(daemon)["plans"] == 0, "the closed session's plan to go after its grace")


def test_the_connection_that_took_a_lease_closing_leaves_the_lease_to_its_session(
    daemon: Daemon, shard: str, session: RawSession
) -> None:
    # What a live client's keep-alive connection does: it closes (idle, its thread ended, replaced after a
    # break) while the process and its session live on. Here the daemon itself closes it after answering.
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=daemon.socket), base_url="http://shardcached"
    ) as http:
        answer = http.post(
            "/v1/shards/open", json={"url": shard, "session": session.id}, headers={"Connection": "close"}
        )
        assert answer.status_code == 200 and answer.headers["connection"] == "close"
    # A request on a new connection is served after the daemon handled the close of the one before.
    assert stats(daemon)["leases"] == 1
    with api(daemon) as http:
        assert http.post("/v1/shards/release", json={"lease": answer.json()["lease"]}).status_code == 204


def test_a_session_is_named_after_the_process_it_reports_when_its_pid_is_not_visible(
    daemon: Daemon, shard: str
) -> None:
    # The daemon sees this test's pid on the socket, so a session is named as without sessions.
    visible = RawSession(daemon, json.dumps({"pid": 7, "host": "trainer-0"}).encode())
    try:
        assert visible.grant is not None and visible.grant.job.startswith("pid ")
        with api(daemon) as http:
            http.post("/v1/shards/open", json={"url": shard, "session": visible.id}).raise_for_status()
        jobs = stats(daemon)["jobs"]
        assert isinstance(jobs, list) and [job["job"] for job in jobs] == [visible.grant.job]
    finally:
        visible.close()


def test_a_request_naming_a_session_that_is_not_open_is_refused_with_404_unknown_session(
    daemon: Daemon, shard: str, session: RawSession
) -> None:
    ended = session.id
    session.close()
    wait_for(lambda: stats(daemon)["sessions"] == 0, "the session to end")
    with api(daemon) as http:
        opened = http.post("/v1/shards/open", json={"url": shard, "session": ended})
        planned = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": [shard], "session": ended}
        )
    for answer in (opened, planned):
        assert answer.status_code == 404 and answer.json()["error"] == "unknown_session"
        assert ended in answer.json()["detail"] and "POST /v1/sessions" in answer.json()["detail"]
    assert (stats(daemon)["leases"], stats(daemon)["plans"], stats(daemon)["misses"]) == (0, 0, 0)


@pytest.mark.parametrize(
    "body",
    [b'{"pid": 0}', b'{"pid": 7, "hots": "x"}', b'{"host": "a b"}', b"[1]", b"not json"],
    ids=["pid-0", "unknown-field", "host-with-space", "not-an-object", "not-json"],
)
def test_a_malformed_session_request_is_refused_with_422_and_starts_no_session(
    daemon: Daemon, body: bytes
) -> None:
    refused = RawSession(daemon, body)
    try:
        assert refused.status == 422
        assert json.loads(refused.answer.read())["error"] == "invalid_request"
    finally:
        refused.close()
    assert stats(daemon)["sessions"] == 0


def test_a_daemon_that_stops_ends_every_session_s_answer_and_waits_for_none(
    daemon: Daemon, session: RawSession, tmp_path: Path
) -> None:
    assert daemon.stop() == 0
    assert session.answer.read() == b""  # the chunked answer ended properly (a cut one raises)
    log = (tmp_path / "daemon0.log").read_text()
    assert "graceful shutdown exceeded" not in log  # uvicorn waited for no session
