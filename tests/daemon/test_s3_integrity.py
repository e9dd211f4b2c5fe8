"""What an open hands over is exactly the remote object, or an error and nothing published.

One daemon and one bucket serve the module; each test uses its own shard.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.daemon_api import api
from harness.devservers import Daemon, start_daemon
from harness.shards import ShardSet, make_tar_shard
from tests.daemon.daemon_helpers import files_in


@pytest.fixture(scope="module")
def shards(s3_client, tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    local = tmp_path_factory.mktemp("integrity-shards")
    bucket = f"integrity-{id(local) % 100000}"
    s3_client.create_bucket(Bucket=bucket)
    names = []
    for i in range(6):
        name = f"shard_{i:06d}.tar"
        make_tar_shard(local / name, i, samples=8)
        s3_client.upload_file(str(local / name), bucket, f"shards/{name}")
        names.append(name)
    return ShardSet(local, names, bucket)


@pytest.fixture(scope="module")
def daemon(shards: ShardSet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    work = tmp_path_factory.mktemp("integrity-daemon")
    short = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    started = start_daemon(
        short / "d.sock", work / "cache", [f"s3://{shards.bucket}"], log=work / "daemon.log"
    )
    yield started
    started.stop()


def _resident(daemon: Daemon) -> set[str]:
    with api(daemon) as http:
        return {shard["url"] for shard in http.get("/v1/shards").json()["shards"]}


def test_open_hands_over_a_local_file_with_the_objects_bytes(shards, daemon):
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
    assert Path(answer["path"]).read_bytes() == Path(shards.local_paths[0]).read_bytes()
    assert answer["size"] == shards.size_of(shards.names[0])
    assert answer["url"] == shards.s3_urls[0]


def test_missing_object_is_404_and_leaves_no_file(shards, daemon):
    missing = f"s3://{shards.bucket}/shards/nope.tar"
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": missing})
    assert answer.status_code == 404
    assert "nope.tar" in answer.json()["detail"]
    assert missing not in _resident(daemon)
    assert not [name for name in files_in(daemon.cache_dir) if name.startswith(".tmp-")]


def test_checksum_mismatch_is_an_error_and_publishes_nothing(shards, daemon):
    before = files_in(daemon.cache_dir)
    with api(daemon) as http:
        answer = http.post(
            "/v1/shards/open", json={"url": shards.s3_urls[1], "checksum": "sha256:" + "0" * 64}
        )
    assert answer.status_code == 502
    assert answer.json()["error"] == "checksum_mismatch"
    assert shards.s3_urls[1] not in _resident(daemon)
    assert files_in(daemon.cache_dir) == before


def test_matching_checksum_is_accepted(shards, daemon):
    digest = hashlib.sha256(Path(shards.local_paths[2]).read_bytes()).hexdigest()
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[2], "checksum": f"sha256:{digest}"})
    assert answer.status_code == 200


def test_an_unknown_checksum_algorithm_is_400(shards, daemon):
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[3], "checksum": "crc99:abcd"})
    assert answer.status_code == 400
    assert answer.json()["error"] == "bad_checksum"


def test_size_differing_from_the_request_is_reported(shards, daemon):
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[4], "size": 12345})
    assert answer.status_code == 502
    assert answer.json()["error"] == "size_mismatch"
    assert "12345" in answer.json()["detail"]


def test_a_checksum_brought_by_a_later_open_is_verified_on_the_hit_and_recorded(shards, daemon):
    url, local = shards.s3_urls[5], Path(shards.local_paths[5])
    checksum = "SHA256:" + hashlib.sha256(local.read_bytes()).hexdigest().upper()  # any spelling
    with api(daemon) as http:
        http.post("/v1/shards/open", json={"url": url}).raise_for_status()  # as a plan's prefetch: none
        answer = http.post("/v1/shards/open", json={"url": url, "checksum": checksum}).json()
    assert answer["hit"] is True
    meta = Path(answer["path"]).with_name(Path(answer["path"]).stem + ".meta.json")
    assert json.loads(meta.read_text())["checksum"] == checksum.lower()
