"""Shards from a real S3 endpoint (moto's server) through the real daemon on a Unix socket."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.daemon_api import api, metric
from tests.daemon.daemon_helpers import Proxy


def test_first_open_misses_and_second_hits(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        first = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
        second = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
        stats = http.get("/v1/stats").json()
    assert (first["hit"], second["hit"]) == (False, True)
    assert (stats["hits"], stats["misses"]) == (1, 1)
    assert stats["bytes_fetched"] == shards.size_of(shards.names[0])


def test_restart_keeps_the_cache_without_downloading_again(make_bucket, daemon_factory, tmp_path):
    shards = make_bucket(count=2)
    cache = tmp_path / "kept"
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache)
    with api(daemon) as http:
        for url in shards.s3_urls:
            http.post("/v1/shards/open", json={"url": url}).raise_for_status()
    assert daemon.stop() == 0
    again = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache)
    with api(again) as http:
        answers = [http.post("/v1/shards/open", json={"url": url}).json() for url in shards.s3_urls]
        stats = http.get("/v1/stats").json()
    assert [a["hit"] for a in answers] == [True, True]
    assert stats["bytes_fetched"] == 0
    assert Path(answers[1]["path"]).read_bytes() == Path(shards.local_paths[1]).read_bytes()


def test_sixteen_concurrent_opens_of_one_shard_download_it_once(make_bucket, daemon_factory):
    shards = make_bucket(count=1, samples=64, payload_bytes=16 * 1024)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])

    def open_once(_: int) -> dict[str, Any]:
        with api(daemon) as http:
            answer: dict[str, Any] = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).json()
            return answer

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(open_once, range(16)))
    size = shards.size_of(shards.names[0])
    assert {a["path"] for a in answers} == {answers[0]["path"]}
    assert metric(daemon, "shardcache_fetched_bytes_total") == size
    with api(daemon) as http:
        assert http.get("/v1/stats").json()["bytes_fetched"] == size


def test_transient_remote_errors_are_retried(make_bucket, daemon_factory, s3_server):
    shards = make_bucket(count=1)
    with Proxy(s3_server.endpoint, fail_first=2) as proxy:
        daemon = daemon_factory(
            allow=[f"s3://{shards.bucket}"], env=proxy.env, extra_args=["--retry-backoff-s", "0.05"]
        )
        with api(daemon) as http:
            answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]})
    assert answer.status_code == 200
    assert Path(answer.json()["path"]).read_bytes() == Path(shards.local_paths[0]).read_bytes()
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="transient"') >= 1


def test_remote_failing_after_retries_is_502_with_a_clear_message(make_bucket, daemon_factory, s3_server):
    shards = make_bucket(count=1)
    with Proxy(s3_server.endpoint, fail_first=1000) as proxy:
        daemon = daemon_factory(
            allow=[f"s3://{shards.bucket}"],
            env=proxy.env,
            extra_args=["--retries", "2", "--retry-backoff-s", "0.01"],
        )
        with api(daemon) as http:
            answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]})
            assert http.get("/v1/health").status_code == 200
    assert answer.status_code == 502
    assert shards.s3_urls[0] in answer.json()["detail"]
    assert "3 attempts" in answer.json()["detail"]
