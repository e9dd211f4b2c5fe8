"""The fetcher's start-up warm-up: S3 client set-up moves off the first fetch and sends nothing remote."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.devservers import S3Server
from shardcached.fetching import Fetcher
from tests.daemon.daemon_helpers import Proxy


@pytest.fixture
def proxied_s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[Proxy]:
    """An S3 endpoint behind a counting proxy, as the standard AWS environment of this process."""
    proxy = Proxy(s3_server.endpoint)
    for name, value in proxy.env.items():
        monkeypatch.setenv(name, value)
    yield proxy
    proxy.close()


def test_warm_up_builds_the_s3_client_without_contacting_the_remote(proxied_s3: Proxy, make_bucket):
    shards = make_bucket(count=1)
    fetcher = Fetcher()
    fetcher.warm_up([f"s3://{shards.bucket}/shards", "/local/paths/need/nothing"])
    assert proxied_s3.connections == 0
    info = fetcher.info(shards.s3_urls[0])
    assert info.size == shards.size_of(shards.names[0])
    assert proxied_s3.connections >= 1


def test_warm_up_of_an_unknown_protocol_is_left_to_the_first_fetch():
    Fetcher().warm_up(["nosuchprotocol://bucket/prefix"])  # logged at debug, no exception
