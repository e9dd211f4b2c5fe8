"""Requests the daemon must refuse, and what it must never expose. One daemon serves the whole module."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.daemon_api import api
from harness.devservers import Daemon, start_daemon
from harness.shards import make_tar_shard


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`allowed/` with a shard and a symlink pointing out of it, beside `secret/`."""
    root = tmp_path_factory.mktemp("refusals")
    (root / "allowed").mkdir()
    (root / "secret").mkdir()
    (root / "allowed2").mkdir()
    make_tar_shard(root / "allowed" / "ok.tar", 0, samples=2)
    make_tar_shard(root / "secret" / "key.tar", 1, samples=2)
    make_tar_shard(root / "allowed2" / "near.tar", 2, samples=2)
    (root / "allowed" / "escape.tar").symlink_to(root / "secret" / "key.tar")
    (root / "allowed" / "linkdir").symlink_to(root / "secret")
    return root


@pytest.fixture(scope="module")
def daemon(layout: Path) -> Iterator[Daemon]:
    short = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    started = start_daemon(
        short / "sock" / "d.sock",
        layout / "cache",
        [str(layout / "allowed"), "s3://good-bucket/data"],
        log=layout / "daemon.log",
    )
    yield started
    started.stop()


def _open(daemon: Daemon, url: str) -> httpx.Response:
    with api(daemon) as http:
        return http.post("/v1/shards/open", json={"url": url})


def test_an_allowed_local_shard_opens(daemon, layout):
    answer = _open(daemon, str(layout / "allowed" / "ok.tar"))
    assert answer.status_code == 200
    assert Path(answer.json()["path"]).read_bytes() == (layout / "allowed" / "ok.tar").read_bytes()


@pytest.mark.parametrize(
    "relative",
    [
        "secret/key.tar",  # plainly outside
        "allowed/../secret/key.tar",  # dot-dot traversal
        "allowed2/near.tar",  # shares the prefix string but not the path segment
        "allowed/escape.tar",  # symlink out of the allowed directory
        "allowed/linkdir/key.tar",  # directory symlink out of it
        "allowed/linkdir/../secret/key.tar",  # `..` after a symlink climbs from the link's target
    ],
)
def test_local_paths_outside_the_allow_list_are_403(daemon, layout, relative):
    answer = _open(daemon, str(layout / relative))
    assert answer.status_code == 403
    assert answer.json()["error"] == "not_allowed"
    assert "--allow" in answer.json()["detail"]


@pytest.mark.parametrize(
    "template",
    [
        "file://{root}/secret/key.tar",
        "file://{root}/allowed/../secret/key.tar",
        "file://{root}/allowed/%2e%2e/secret/key.tar",  # percent-encoded traversal
        "file://{root}/allowed/%2E%2E%2Fsecret%2Fkey.tar",  # encoded slashes too
        "file://{root}/allowed/escape.tar",
    ],
)
def test_file_urls_cannot_escape_the_allow_list(daemon, layout, template):
    answer = _open(daemon, template.format(root=layout))
    assert answer.status_code == 403


@pytest.mark.parametrize(
    "url",
    [
        "s3://other-bucket/data/x.tar",
        "s3://good-bucket/private/x.tar",
        "s3://good-bucket/data/../private/x.tar",
        "s3://good-bucket/data/%2e%2e/private/x.tar",
        "s3://good-bucket/database/x.tar",
        "http://example.com/data/x.tar",
    ],
)
def test_remote_urls_outside_the_allow_list_are_403(daemon, url):
    assert _open(daemon, url).status_code == 403


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b'{"url": ""}',
        b'{"url": 42}',
        b'{"url": "/x", "size": -1}',
        b'{"url": "/x", "unexpected": 1}',
        b'{"url": "' + b"a" * 5000 + b'"}',
    ],
)
def test_malformed_open_bodies_are_4xx_in_the_error_shape(daemon, body):
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", content=body, headers={"content-type": "application/json"})
        healthy = http.get("/v1/health").status_code
    assert 400 <= answer.status_code < 500
    assert set(answer.json()) == {"error", "detail"}
    assert healthy == 200


def test_control_characters_in_urls_are_refused_at_validation_with_422(daemon, layout):
    answer = _open(daemon, f"{layout}/allowed/ok.tar\x00.txt")
    assert answer.status_code == 422
    assert answer.json()["error"] == "invalid_request"


def test_percent_encoded_control_characters_in_urls_are_400(daemon, layout):
    answer = _open(daemon, "s3://good-bucket/data/ok%00.tar")
    assert answer.status_code == 400
    assert answer.json()["error"] == "bad_url"


def test_plans_with_urls_outside_the_allow_list_are_403(daemon, layout):
    with api(daemon) as http:
        answer = http.post(
            "/v1/plans",
            json={"job": "j", "slot": 0, "epoch": 0, "urls": [str(layout / "secret" / "key.tar")]},
        )
    assert answer.status_code == 403


def test_the_socket_grants_nothing_to_other_users(daemon):
    mode = os.stat(daemon.socket).st_mode
    assert stat.S_ISSOCK(mode)
    assert mode & 0o007 == 0
    assert os.stat(Path(daemon.socket).parent).st_mode & 0o007 == 0


def test_the_tcp_listener_serves_health_and_metrics_only(daemon, layout):
    base = daemon.metrics_url.removesuffix("/metrics")
    assert httpx.get(f"{base}/v1/health").status_code == 200
    assert httpx.get(f"{base}/metrics").status_code == 200
    assert httpx.post(
        f"{base}/v1/shards/open", json={"url": str(layout / "allowed" / "ok.tar")}
    ).status_code in (
        404,
        405,
    )
    assert (
        httpx.get(f"{base}/v1/shards/data", params={"url": str(layout / "allowed" / "ok.tar")}).status_code
        == 404
    )
    assert httpx.get(f"{base}/v1/stats").status_code == 404


def test_unknown_routes_answer_in_the_error_shape(daemon):
    with api(daemon) as http:
        answer = http.get("/v1/nothing-here")
    assert answer.status_code == 404
    assert set(answer.json()) == {"error", "detail"}
