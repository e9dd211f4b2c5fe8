"""Shards through a real daemon and a real S3 endpoint give the same samples as local paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.pipelines import keys, make_tars, plans_when, write_tar
from shardcache import Dataset, RuntimeContext
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import DaemonUnavailable


def strip(samples: list[dict[str, object]]) -> list[dict[str, object]]:
    return [{k: v for k, v in s.items() if k != "__shard__"} for s in samples]


def test_s3_urls_through_the_daemon_match_local_paths(make_bucket, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    shards = make_bucket(count=4, samples=6, payload_bytes=256)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/"])
    client = DaemonClient(str(daemon.socket), required=True)
    ctx = RuntimeContext(rank=1, world_size=2, seed=4)
    remote = Dataset.from_source("tars", shards.s3_urls, daemon=client).shuffle(5)
    local = Dataset.from_source("tars", shards.local_paths, daemon=None).shuffle(5)
    assert strip(list(remote.iter_context(ctx))) == strip(list(local.iter_context(ctx)))
    first = client.stats()
    assert first.hits + first.misses == 2  # this slot's two shards, one open each
    again = Dataset.from_source("tars", shards.s3_urls, daemon=client)
    assert sorted(keys(again.iter_context(ctx))) == sorted(keys(local.iter_context(ctx)))
    assert client.stats().hits >= first.hits + 2  # the second pass is served from the node cache


def test_socket_path_setting_reads_through_that_daemon(local_shards, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    via_daemon = Dataset.from_source("tars", local_shards.local_paths, daemon=str(daemon.socket))
    assert list(via_daemon) == list(Dataset.from_source("tars", local_shards.local_paths, daemon=None))
    stats = DaemonClient(str(daemon.socket)).stats()
    assert (stats.resident_shards, stats.hits + stats.misses) == (4, 4)


def test_required_daemon_that_is_absent_is_an_error(local_shards, short_tmp) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source(
        "tars",
        local_shards.local_paths,
        # restart_wait_s=0: not the wait for a restarting daemon (test_daemon_restart_wait), only the error
        daemon=DaemonClient(str(short_tmp / "none.sock"), required=True, restart_wait_s=0),
    )
    with pytest.raises(DaemonUnavailable):
        list(ds)


def test_an_iterator_dropped_unfinished_deletes_its_plans_at_once(tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    shards = make_tars(tmp_path / "tars", 4, 3)
    daemon = daemon_factory(allow=[str(tmp_path / "tars")])
    client = DaemonClient(str(daemon.socket), required=True)
    ds = Dataset.from_source("tars", shards, daemon=client, context=RuntimeContext())
    it = iter(ds)
    next(it)
    assert len(plans_when(client, 2)) == 2  # this epoch's and the next (announced in the background)
    del it
    ds = Dataset.from_source("tars", shards, daemon=None)  # drops the last reference to the iterator
    assert client.stats().plans == 0  # without waiting for the cyclic garbage collector


def depth_of(path: str) -> str:
    return path.replace("/images/", "/depth/")


def test_sidecar_shards_are_in_the_slots_plan_and_opened_under_it(tmp_path: Path, daemon_factory) -> None:  # type: ignore[no-untyped-def]
    images = make_tars(tmp_path / "images", 2, 3)
    (tmp_path / "depth").mkdir()
    for s in range(2):
        write_tar(
            tmp_path / "depth" / f"shard_{s:06d}.tar", [(f"s{s:03d}_{i:04d}.d", b"x") for i in range(3)]
        )
    daemon = daemon_factory(allow=[str(tmp_path)])
    client = DaemonClient(str(daemon.socket), required=True)
    ds = Dataset.from_source("tars", images, daemon=client, sidecars=[("depth", depth_of)])
    it = iter(ds.iter_context(RuntimeContext()))
    next(it)
    plans = plans_when(client, 2)
    assert [plan["len"] for plan in plans] == [4, 4]  # each shard followed by its sidecar, both epochs
    assert plans[0]["cursor"] == 2  # the first shard and its sidecar were opened under the plan
    assert len(list(it)) == 5
