"""A cache filesystem that other programs' files fill (the daemon's capacity not reached): the daemon refuses
opens at once with 507 `cache_disk_full` instead of waiting `--evict-wait-s` for room no release can give,
and an `auto` client reads shards directly and stops asking for a while.

The daemon runs with `--evict-wait-s 600`: an open that waited would time the test out, and
`shardcache_room_waits_total` says whether one waited. Nothing here measures time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.polling import wait_for
from harness.shards import make_tar_shard
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import InsufficientCapacity
from tests.hardening.cache_checks import assert_cache_intact

REFUSED = ("shardcache_refused_opens_total", 'code="cache_disk_full"')
WAITED = ("shardcache_room_waits_total", 'reason="disk_full"')
NEVER_WAITED_OUT = ["--evict-wait-s", "600", "--retries", "1", "--retry-backoff-s", "0.01"]


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    """Six tar shards of about 0.95 MiB on the ordinary disk (the 'remote'), outside the small filesystem."""
    folder = tmp_path / "remote"
    folder.mkdir()
    paths = []
    for i in range(6):
        path = folder / f"shard_{i:06d}.tar"
        make_tar_shard(path, i, samples=16, payload_bytes=60 * 1024)
        paths.append(str(path))
    return paths


def fill(small_fs: Path, leave: int) -> Path:
    """A neighbour's file that leaves `leave` bytes free on the small filesystem."""
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    neighbour = small_fs / "neighbour.bin"
    neighbour.write_bytes(b"n" * (free - leave))
    return neighbour


@pytest.fixture
def full_disk_daemon(
    small_fs: Path, daemon_factory: Callable[..., Daemon], shards: list[str]
) -> Iterator[Daemon]:
    """A daemon with a 64 MiB capacity whose 3 MiB cache filesystem a neighbour filled to 0.5 MiB free."""
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity="64MiB",
        cache_dir=small_fs / "cache",
        extra_args=NEVER_WAITED_OUT,
    )
    fill(small_fs, leave=512 * 1024)
    yield daemon


@pytest.mark.timeout(90)
def test_an_open_on_a_disk_full_of_other_files_is_refused_without_waiting(
    full_disk_daemon: Daemon, shards: list[str]
) -> None:
    with api(full_disk_daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards[0]})
    assert answer.status_code == 507, answer.text
    assert answer.json()["error"] == "cache_disk_full"
    assert "other files fill it" in answer.json()["detail"]
    assert metric(full_disk_daemon, *WAITED) == 0
    assert metric(full_disk_daemon, *REFUSED) == 1


@pytest.mark.timeout(90)
def test_refusals_leave_nothing_partial_and_the_daemon_healthy(
    full_disk_daemon: Daemon, shards: list[str]
) -> None:
    with api(full_disk_daemon) as http:
        statuses = [http.post("/v1/shards/open", json={"url": url}).status_code for url in shards]
        assert http.get("/v1/health").status_code == 200
    assert statuses == [507] * len(shards)
    originals = {url: Path(url) for url in shards}
    assert assert_cache_intact(full_disk_daemon.cache_dir, originals) == 0
    assert [p.name for p in full_disk_daemon.cache_dir.iterdir() if p.name.startswith(".part-")] == []
    assert full_disk_daemon.process.poll() is None


def test_the_free_space_gauge_reports_the_cache_filesystem(full_disk_daemon: Daemon, small_fs: Path) -> None:
    fs = os.statvfs(small_fs)
    assert metric(full_disk_daemon, "shardcache_disk_free_bytes") == fs.f_bavail * fs.f_frsize


@pytest.mark.timeout(90)
def test_an_auto_client_reads_directly_and_stops_asking_while_the_disk_is_full(
    full_disk_daemon: Daemon, shards: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shardcache")
    client = DaemonClient(full_disk_daemon.socket, disk_full_retry_s=600)
    for url in shards:
        with client.open(url) as handle:
            assert handle.read() == Path(url).read_bytes()
    assert metric(full_disk_daemon, *REFUSED) == 1  # only the first shard asked the daemon
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "cache_disk_full" in warnings[0] and "docs/troubleshooting.md" in warnings[0]


@pytest.mark.timeout(90)
def test_an_auto_client_asks_again_after_its_window_and_uses_the_cache_once_there_is_room(
    full_disk_daemon: Daemon, small_fs: Path, shards: list[str]
) -> None:
    client = DaemonClient(full_disk_daemon.socket, disk_full_retry_s=0.2)
    with client.open(shards[0]) as handle:
        handle.read()
    (small_fs / "neighbour.bin").unlink()  # the neighbour cleans up

    def cached() -> bool:
        with client.open(shards[1]) as handle:
            assert handle.read() == Path(shards[1]).read_bytes()
        return metric(full_disk_daemon, "shardcache_requests_total", 'result="miss"') == 1

    wait_for(cached, "the client to ask the daemon again and get the shard cached")
    assert metric(full_disk_daemon, *REFUSED) == 1


def test_a_required_client_raises_with_what_to_do_about_the_full_disk(
    full_disk_daemon: Daemon, shards: list[str]
) -> None:
    client = DaemonClient(full_disk_daemon.socket, required=True)
    with pytest.raises(InsufficientCapacity) as caught:
        with client.open(shards[0]):
            pass
    assert caught.value.code == "cache_disk_full"
    message = str(caught.value)
    assert shards[0] in message and "free space" in message and "docs/troubleshooting.md" in message


@pytest.mark.timeout(90)
def test_an_open_still_waits_when_releasing_a_lease_can_make_room(
    small_fs: Path, daemon_factory: Callable[..., Daemon], shards: list[str]
) -> None:
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity="64MiB",
        cache_dir=small_fs / "cache",
        extra_args=NEVER_WAITED_OUT,
    )
    fill(small_fs, leave=1800 * 1024)  # room for one shard and the 5% floor, not for two
    with api(daemon) as http:
        held = http.post("/v1/shards/open", json={"url": shards[0]})
        assert held.status_code == 200, held.text
        answers: list[httpx.Response] = []
        second = threading.Thread(
            target=lambda: answers.append(http.post("/v1/shards/open", json={"url": shards[1]}))
        )
        second.start()
        wait_for(lambda: metric(daemon, *WAITED) == 1, "the second open to wait for the leased shard")
        http.post("/v1/shards/release", json={"lease": held.json()["lease"]}).raise_for_status()
        second.join(timeout=60)
    assert [a.status_code for a in answers] == [200], [a.text for a in answers]
    assert metric(daemon, "shardcache_evictions_total", 'reason="disk_full"') == 1
    assert metric(daemon, *REFUSED) == 0
