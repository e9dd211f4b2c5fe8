"""DaemonClient against the real daemon on a Unix socket; shards on local disk and in a real S3 endpoint."""

from __future__ import annotations

import mmap
import multiprocessing
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.shards import ShardSet
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import NotAllowed, RemoteNotFound


def read_through(client: DaemonClient, url: str) -> bytes:
    with client.open(url) as shard:
        return shard.read()


def test_open_returns_the_bytes_of_a_local_shard(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with DaemonClient(daemon.socket, required=True) as client:
        for path in local_shards.local_paths:
            assert read_through(client, path) == Path(path).read_bytes()


def test_open_returns_the_bytes_of_an_s3_object(daemon_factory, make_bucket) -> None:
    shards = make_bucket(count=2)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/"])
    with DaemonClient(daemon.socket, required=True) as client:
        for url, path in zip(shards.s3_urls, shards.local_paths, strict=True):
            assert read_through(client, url) == Path(path).read_bytes()


def test_second_open_of_a_shard_is_a_hit(daemon_factory, make_bucket) -> None:
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/"])
    with DaemonClient(daemon.socket, required=True) as client:
        read_through(client, shards.s3_urls[0])
        first = client.stats()
        read_through(client, shards.s3_urls[0])
        second = client.stats()
    assert (first.misses, first.hits) == (1, 0)
    assert (second.misses, second.hits) == (1, 1)


def test_open_yields_a_real_file_that_can_be_mmapped(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    path = local_shards.local_paths[0]
    with DaemonClient(daemon.socket, required=True) as client, client.open(path) as shard:
        with mmap.mmap(shard.fileno(), 0, access=mmap.ACCESS_READ) as view:
            assert view[:] == Path(path).read_bytes()


def test_stream_handoff_returns_the_same_bytes(daemon_factory, make_bucket) -> None:
    shards = make_bucket(count=1, samples=64, payload_bytes=8192)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/"])
    with DaemonClient(daemon.socket, required=True, handoff="stream") as client:
        assert read_through(client, shards.s3_urls[0]) == Path(shards.local_paths[0]).read_bytes()
        assert read_through(client, shards.s3_urls[0]) == Path(shards.local_paths[0]).read_bytes()


def test_stream_of_an_uncached_shard_returns_its_bytes(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    path = local_shards.local_paths[1]
    with DaemonClient(daemon.socket, required=True) as client, client.open(path):
        pass
    with DaemonClient(daemon.socket, required=True) as client:
        with client.stream(path) as stream:
            assert stream.read() == Path(path).read_bytes()


def test_url_outside_the_allow_list_raises_not_allowed_naming_it(
    daemon_factory, local_shards: ShardSet, tmp_path: Path
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes(b"x" * 100)
    with DaemonClient(daemon.socket, required=True) as client:
        with pytest.raises(NotAllowed, match=str(outside)), client.open(str(outside)):
            pass


def test_missing_s3_object_raises_remote_not_found_naming_it(daemon_factory, make_bucket) -> None:
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/"])
    missing = f"s3://{shards.bucket}/shards/missing.tar"
    with DaemonClient(daemon.socket, required=True) as client:
        with pytest.raises(RemoteNotFound, match=missing), client.open(missing):
            pass


def test_refusals_do_not_fall_back_to_direct_reads(
    daemon_factory, local_shards: ShardSet, tmp_path: Path
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    outside = tmp_path / "elsewhere.tar"
    outside.write_bytes(b"x")
    with DaemonClient(daemon.socket) as client:
        with pytest.raises(NotAllowed), client.open(str(outside)):
            pass


def _read_in_child(client: DaemonClient, path: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put(read_through(client, path))


def test_client_keeps_working_in_forked_children(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = DaemonClient(daemon.socket, required=True)
    paths = local_shards.local_paths
    read_through(client, paths[0])  # the parent holds an open keep-alive connection when it forks
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_read_in_child, args=(client, p, queue)) for p in paths]
    for child in children:
        child.start()
    results = sorted(queue.get(timeout=60) for _ in children)
    for child in children:
        child.join(30)
        assert child.exitcode == 0
    assert results == sorted(Path(p).read_bytes() for p in paths)
    assert read_through(client, paths[1]) == Path(paths[1]).read_bytes()  # the parent's connection is intact
    client.close()


def test_client_serves_many_threads_at_once(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    paths = local_shards.local_paths * 8
    with DaemonClient(daemon.socket, required=True) as client, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: read_through(client, p), paths))
    assert results == [Path(p).read_bytes() for p in paths]


def test_pickled_client_works_in_a_spawned_process(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    client = DaemonClient(daemon.socket, required=True)
    read_through(client, local_shards.local_paths[0])
    copy = pickle.loads(pickle.dumps(client))
    assert read_through(copy, local_shards.local_paths[2]) == Path(local_shards.local_paths[2]).read_bytes()


def test_client_reconnects_after_the_daemon_restarts(
    daemon_factory, local_shards: ShardSet, short_tmp: Path, tmp_path: Path
) -> None:
    socket_path = short_tmp / "restart.sock"
    allow = [str(local_shards.local_dir)]
    daemon = daemon_factory(allow=allow, socket_path=socket_path)
    path = local_shards.local_paths[0]
    with DaemonClient(str(socket_path), required=True) as client:
        read_through(client, path)
        daemon.stop()
        daemon_factory(allow=allow, socket_path=socket_path)
        assert read_through(client, path) == Path(path).read_bytes()
        assert client.stats().hits == 1  # the restarted daemon kept the cache


def test_fallen_back_client_returns_to_a_restarted_daemon(
    daemon_factory, local_shards: ShardSet, short_tmp: Path
) -> None:
    socket_path = short_tmp / "late.sock"
    path = local_shards.local_paths[0]
    with DaemonClient(str(socket_path), reprobe_interval=0.0) as client:
        assert read_through(client, path) == Path(path).read_bytes()  # direct: nobody answers yet
        daemon_factory(allow=[str(local_shards.local_dir)], socket_path=socket_path)
        read_through(client, path)
        assert client.stats().misses == 1


def test_plans_register_and_delete(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with DaemonClient(daemon.socket, required=True) as client:
        plan = client.register_plan("job-a", 0, 0, local_shards.local_paths)
        assert plan
        assert client.stats().plans == 1
        with client.open(local_shards.local_paths[0], plan=plan) as shard:
            shard.read()
        client.delete_plan(plan)
        assert client.stats().plans == 0
        client.delete_plan(plan)  # unknown by now: quiet


def test_prefetch_evict_and_shards_list(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    paths = local_shards.local_paths
    with DaemonClient(daemon.socket, required=True) as client:
        for path in paths[:2]:
            with client.local_path(path) as local:
                assert local is not None and Path(local).read_bytes() == Path(path).read_bytes()
        resident = {shard.url for shard in client.shards()}
        assert {str(Path(p).resolve()) for p in paths[:2]} <= resident or set(paths[:2]) <= resident
        client.evict(paths[0])
        assert client.stats().resident_shards == 1
        client.prefetch(paths[2:])
        assert client.health().status == "ok"
        assert client.available()


def test_closed_shards_are_released_so_the_cache_can_evict_them(
    daemon_factory, local_shards: ShardSet
) -> None:
    sizes = [Path(p).stat().st_size for p in local_shards.local_paths]
    capacity = max(sizes) * 2 + 1  # room for two shards: every third open must evict a released one
    daemon = daemon_factory(
        allow=[str(local_shards.local_dir)], capacity=f"{capacity}B", extra_args=["--evict-wait-s", "2"]
    )
    with DaemonClient(daemon.socket, required=True) as client:
        for path in local_shards.local_paths * 2:
            assert read_through(client, path) == Path(path).read_bytes()
        stats = client.stats()
    assert stats.evictions >= len(local_shards.local_paths)
    assert stats.used <= capacity


def test_open_shard_is_not_evicted_while_the_reader_holds_it(daemon_factory, local_shards: ShardSet) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    first, second = local_shards.local_paths[:2]
    with DaemonClient(daemon.socket, required=True) as client, client.open(first) as shard:
        client.evict(first)  # evicting a leased shard must not pull the file from under its reader
        with client.open(second) as other:
            other.read()
        assert shard.read() == Path(first).read_bytes()
