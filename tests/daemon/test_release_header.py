"""Lease releases riding on the next request (`Shardcache-Release`), and small answers in one write."""

from __future__ import annotations

import json
import socket

from harness.daemon_api import api
from shardcache.daemon_access.daemon_client import DaemonClient


def pinned(daemon) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    with api(daemon) as http:
        return {s["url"]: s["pinned"] for s in http.get("/v1/shards").json()["shards"]}


def test_a_release_header_ends_its_leases_before_the_request_is_served(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    first, second = local_shards.local_paths[:2]
    with api(daemon) as http:
        lease = http.post("/v1/shards/open", json={"url": first}).json()["lease"]
        answer = http.post(
            "/v1/shards/open", json={"url": second}, headers={"Shardcache-Release": f"{lease}, unknown-lease"}
        )
        assert answer.status_code == 200
        assert http.post("/v1/shards/release", json={"lease": lease}).status_code == 404


def test_a_shard_closed_at_once_is_released_by_the_clients_next_request(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    path = local_shards.local_paths[0]
    with DaemonClient(daemon.socket, required=True) as client:
        with client.open(path) as handle:
            handle.read(512)
        assert set(pinned(daemon).values()) == {True}  # held: no request of its own was sent
        assert [shard.pinned for shard in client.shards()] == [False]  # carried by this request


def test_close_sends_the_releases_still_held(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = DaemonClient(daemon.socket, required=True)
    with client.open(local_shards.local_paths[0]):
        pass
    client.close()
    assert set(pinned(daemon).values()) == {False}


def test_an_open_answer_arrives_in_one_write(daemon_factory, local_shards):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    body = json.dumps({"url": local_shards.local_paths[0]}).encode()
    request = b"POST /v1/shards/open HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(daemon.socket)
        sock.settimeout(30)
        sock.sendall(request)
        first = sock.recv(65536)  # one read: status line, headers and body were sent together
    head, _, rest = first.partition(b"\r\n\r\n")
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
    )
    assert head.startswith(b"HTTP/1.1 200") and len(rest) == length
