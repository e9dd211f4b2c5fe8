"""`immutable=True`: a dataset's plans say its shards are never rewritten in place; an older daemon that
refuses the field still gets the plan; the option is checked and leaves the data's fingerprint alone."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import make_tars
from shardcache import DaemonClient, Dataset
from shardcache.errors import ConfigError


class OldPlansDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A daemon from before immutable plans (and sessions), as far as `POST /v1/plans` goes: its request
    model forbids unknown fields (422, naming the field, as the real one answers) and takes the rest. It
    records every plan body it was sent."""

    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.sent: list[dict[str, Any]] = []
        super().__init__(path, _OldPlansHandler)


class _OldPlansHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(200, {"status": "ok", "version": "0.0.9"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/plans":  # older than sessions too: FastAPI's answer to a route it lacks
            self._answer(404, {"detail": "Not Found"})
            return
        server = self.server
        assert isinstance(server, OldPlansDaemon)
        server.sent.append(body)
        extra = sorted(set(body) - {"job", "slot", "epoch", "urls"})
        if extra:
            detail = f"{extra[0]}: Extra inputs are not permitted; see the HTTP API reference in docs/api.md"
            self._answer(422, {"error": "invalid_request", "detail": detail})
        else:
            self._answer(200, {"plan": f"p{len(server.sent)}"})

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def old_daemon(short_tmp: Path) -> Iterator[OldPlansDaemon]:
    server = OldPlansDaemon(str(short_tmp / "old.sock"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_an_older_daemon_refusing_immutable_still_gets_the_plan(old_daemon: OldPlansDaemon) -> None:
    client = DaemonClient(old_daemon.server_address, required=True)  # type: ignore[arg-type]
    urls = ["s3://bucket/a.tar", "s3://bucket/b.tar"]
    first = client.register_plan("job", 0, 0, urls, immutable=True)
    second = client.register_plan("job", 0, 1, urls, immutable=True)
    client.close()
    assert (first, second) == ("p2", "p3")
    assert ["immutable" in body for body in old_daemon.sent] == [True, False, False]  # offered once


def test_a_plan_carries_immutable_only_when_declared(old_daemon: OldPlansDaemon) -> None:
    client = DaemonClient(old_daemon.server_address, required=True)  # type: ignore[arg-type]
    assert client.register_plan("job", 0, 0, ["s3://bucket/a.tar"]) == "p1"
    client.close()
    assert old_daemon.sent == [{"job": "job", "slot": 0, "epoch": 0, "urls": ["s3://bucket/a.tar"]}]


def test_immutable_must_be_a_bool_naming_the_option(tmp_path: Path) -> None:
    shards = make_tars(tmp_path / "tars", 1, 1)
    with pytest.raises(ConfigError, match="immutable='yes': expected True"):
        Dataset.from_source("tars", shards, daemon=None, immutable="yes")


def test_immutable_leaves_the_fingerprint_alone(tmp_path: Path) -> None:
    shards = make_tars(tmp_path / "tars", 2, 2)
    plain = Dataset.from_source("tars", shards, daemon=None)
    frozen = Dataset.from_source("tars", shards, daemon=None, immutable=True)
    assert frozen.fingerprint() == plain.fingerprint()
    assert list(frozen) == list(plain)
