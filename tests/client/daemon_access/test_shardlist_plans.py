"""Plans in their compact form: the shard list uploaded once, then positions; url lists for older daemons."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from harness.polling import wait_for
from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.shards import ListedUrls, ShardRef, ShardTuple


def listed(shards: ShardTuple, positions: list[int]) -> ListedUrls:
    return ListedUrls(shards, np.asarray(positions, dtype=np.int32))


def test_plans_over_a_shard_tuple_register_as_positions_in_it(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--prefetch-depth", "0"])
    shards = ShardTuple(ShardRef(path) for path in local_shards.local_paths)
    with DaemonClient(daemon.socket, required=True) as client:
        now = client.register_plan("j", 0, 0, listed(shards, [3, 0, 2]))
        following = client.register_plan("j", 0, 1, listed(shards, [1, 2]), ahead=True)
        plans = {p["id"]: (p["epoch"], p["len"]) for p in client.plans()}
        assert plans == {now: (0, 3), following: (1, 2)}
        assert client.register_plan("j", 0, 0, listed(shards, [3, 0, 2])) == now  # the same plan again


def test_consecutive_repeats_of_a_listed_plan_are_kept_once() -> None:
    shards = ShardTuple(ShardRef(f"s3://b/{i}") for i in range(4))
    urls = listed(shards, [2, 2, 0, 0, 2, 3, 3]).without_repeats()
    assert list(urls) == ["s3://b/2", "s3://b/0", "s3://b/2", "s3://b/3"]
    assert urls[1:].positions.tolist() == [0, 2, 3]


class _OldPlanRequest(BaseModel):
    """`POST /v1/plans` as daemons before shard lists took it: urls only, unknown fields refused."""

    model_config = ConfigDict(extra="forbid")
    job: str
    slot: int
    epoch: int
    urls: list[str]


@pytest.fixture
def old_daemon(short_tmp: Path) -> Iterator[tuple[str, list[_OldPlanRequest]]]:
    """A daemon's API before shard lists (no `PUT /v1/shardlists`), served by uvicorn on a Unix socket; the
    plans it received."""
    received: list[_OldPlanRequest] = []
    app = FastAPI()

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": "0.0-old"}

    @app.post("/v1/plans")
    async def add_plan(body: _OldPlanRequest) -> dict[str, str]:
        received.append(body)
        return {"plan": f"p{len(received)}"}

    socket = str(short_tmp / "old.sock")
    server = uvicorn.Server(uvicorn.Config(app, uds=socket, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, "the old daemon's API to listen")
    yield socket, received
    server.should_exit = True
    thread.join(timeout=10)


def test_against_an_older_daemon_plans_go_as_url_lists(old_daemon: tuple[str, list[_OldPlanRequest]]) -> None:
    socket, received = old_daemon
    shards = ShardTuple(ShardRef(f"s3://b/{i}.tar") for i in range(4))
    with DaemonClient(socket, required=True) as client:
        assert client.register_plan("j", 0, 0, listed(shards, [2, 1])) == "p1"
        assert client.register_plan("j", 0, 1, listed(shards, [0])) == "p2"
    assert [(r.epoch, r.urls) for r in received] == [
        (0, ["s3://b/2.tar", "s3://b/1.tar"]),
        (1, ["s3://b/0.tar"]),
    ]
