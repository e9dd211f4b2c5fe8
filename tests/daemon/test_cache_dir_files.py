"""What the daemon does with files in its cache directory that it did not write: never serve them."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from harness.daemon_api import api
from shardcached.serving.api import _NoFollowFileResponse


def test_a_shard_file_replaced_by_a_symlink_is_fetched_again_instead_of_streamed(
    daemon_factory, local_shards, tmp_path
):
    secret = tmp_path / "secret"
    secret.write_bytes(b"private key material\n")
    url = local_shards.local_paths[0]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with api(daemon) as http:
        opened = http.post("/v1/shards/open", json={"url": url}).json()
        http.post("/v1/shards/release", json={"lease": opened["lease"]}).raise_for_status()
        cached = Path(opened["path"])
        cached.unlink()
        cached.symlink_to(secret)
        streamed = http.get("/v1/shards/data", params={"url": url})
    assert streamed.status_code == 200
    assert streamed.content == Path(url).read_bytes()


def test_the_stream_response_refuses_to_open_a_symlink(tmp_path):
    # The service checks files with lstat first; O_NOFOLLOW at the open closes the race after that
    # check. This pins that the response really opens through our O_NOFOLLOW hook.
    target = tmp_path / "target"
    target.write_bytes(b"x" * 100)
    link = tmp_path / "link"
    link.symlink_to(target)

    async def stream(request: Request) -> _NoFollowFileResponse:
        return _NoFollowFileResponse(link, stat_result=os.lstat(target))

    async def get() -> None:
        transport = httpx.ASGITransport(app=Starlette(routes=[Route("/", stream)]))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await client.get("/")

    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        asyncio.run(get())
