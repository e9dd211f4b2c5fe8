"""Leases and plans follow the process that holds them; one job cannot pin the whole cache.

Real daemon, real trainer processes (lease_holder.py opens shards through `DaemonClient` and blocks), real
SIGKILL. Lease TTLs stay at their 300 s default: whatever ends the pins here is the holder's exit (its
session's connection closing, or for a client without sessions its pid's exit) or the per-job bound,
never the TTL. Times are measured and printed (docs/benchmarks.md quotes them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.namespaces import require_namespaces, stop_namespaced
from harness.polling import wait_for
from harness.shards import make_tar_shard
from shardcache.daemon_access.daemon_client import DaemonClient

HOLDER = Path(__file__).parents[2] / "harness" / "lease_holder.py"
SHARD_BYTES = 64 * 1024  # about: two samples of 32 KiB


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    folder = tmp_path / "tars"
    folder.mkdir()
    paths = []
    for i in range(12):
        path = folder / f"shard_{i:06d}.tar"
        make_tar_shard(path, i, samples=2, payload_bytes=SHARD_BYTES // 2)
        paths.append(str(path))
    return paths


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            with_group = proc.pid  # each holder leads its own process group
            os.killpg(with_group, signal.SIGKILL)
        proc.wait(timeout=30)


def _capacity(shards: list[str], count: int) -> str:
    """A capacity of `count` shards and a half."""
    size = Path(shards[0]).stat().st_size
    return f"{count * size + size // 2}B"


def start_holder(
    holders: list[subprocess.Popen[bytes]], daemon: Daemon, urls: list[str], tmp: Path, *extra: str
) -> list[int]:
    """A trainer process (in its own process group) holding `urls` open; its pids once it holds them."""
    ready = tmp / f"ready{len(holders)}"
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), daemon.socket, str(ready), *urls, *extra], start_new_session=True
    )
    holders.append(proc)
    wait_for(lambda: ready.exists() or proc.poll() is not None, "the holder to open its shards", 60)
    assert proc.poll() is None, "the holder exited"
    return [int(line) for line in ready.read_text().split()]


def pinned_shards(daemon: Daemon) -> int:
    with api(daemon) as http:
        return sum(shard["pinned"] for shard in http.get("/v1/shards").json()["shards"])


def released_within(daemon: Daemon, kill: Callable[[], None], deadline_s: float) -> float:
    """Seconds from `kill()` until no shard is pinned; fails past `deadline_s`."""
    started = time.monotonic()
    kill()
    wait_for(lambda: pinned_shards(daemon) == 0, "the killed holder's pins to be released", deadline_s)
    return time.monotonic() - started


def read_through(client: DaemonClient, urls: list[str]) -> float:
    """Seconds to open and read every shard of `urls`, closing each (a well-behaved job)."""
    started = time.monotonic()
    for url in urls:
        with client.open(url) as handle:
            assert handle.read() == Path(url).read_bytes()
    return time.monotonic() - started


def test_kill_9_of_a_trainer_releases_its_pins_and_plans_within_seconds(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity=_capacity(shards, 4),
        extra_args=["--max-job-pinned", "100%", "--evict-wait-s", "5"],
    )
    (pid,) = start_holder(holders, daemon, shards[:4], tmp_path, "--plan", "killed-job")
    assert pinned_shards(daemon) == 4
    with api(daemon) as http:
        assert http.get("/v1/stats").json()["plans"] == 1

    seconds = released_within(daemon, lambda: os.kill(pid, signal.SIGKILL), 5.0)
    print(f"\nkill -9 of a trainer: pins released after {seconds:.2f} s (lease TTL 300 s)")

    client = DaemonClient(daemon.socket)
    other = read_through(client, shards[4:10])  # another job's shards, through the cache
    print(f"another job's 6 shards after the kill: {other:.2f} s")
    assert other < 5.0  # not one open waited --evict-wait-s
    stats = client.stats()
    assert stats.hits + stats.misses == 4 + 6  # every shard went through the cache
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 4
    with api(daemon) as http:  # the plan goes after its grace period (5 s) unless taken over
        wait_for(lambda: http.get("/v1/stats").json()["plans"] == 0, "the killed trainer's plan to go", 10)


def test_a_trainer_in_a_pid_namespace_the_daemon_cannot_see_has_its_pins_released_within_seconds(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    # A DaemonSet pod beside trainer pods: the daemon lives in its own PID namespace, so SO_PEERCRED gives
    # pid 0 for a trainer outside it and the daemon cannot follow its pid. It follows its session instead:
    # the kernel closes the session's connection when the trainer dies. The TTL stays at 300 s.
    unshare = require_namespaces()
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity=_capacity(shards, 4),
        extra_args=["--max-job-pinned", "100%"],
        wrapper=[unshare, "--pid", "--fork", "--kill-child=SIGTERM"],
    )
    try:
        (pid,) = start_holder(holders, daemon, shards[:2], tmp_path, "--plan", "unseen-job")
        assert pinned_shards(daemon) == 2
        seconds = released_within(daemon, lambda: os.kill(pid, signal.SIGKILL), 5.0)
        print(f"\nkill -9 of a trainer in another PID namespace: pins released after {seconds:.2f} s")
        assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 2
        assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="ttl"') == 0
        with api(daemon) as http:
            wait_for(lambda: http.get("/v1/stats").json()["plans"] == 0, "the killed trainer's plan to go")
    finally:
        assert stop_namespaced(daemon) == 0


def test_kill_9_of_a_trainers_process_group_releases_every_member_s_pins(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity=_capacity(shards, 4),
        extra_args=["--max-job-pinned", "100%"],
    )
    pids = start_holder(holders, daemon, shards[:4], tmp_path, "--fork-half")
    assert len(pids) == 2 and pinned_shards(daemon) == 4
    with api(daemon) as http:
        jobs = {job["job"] for job in http.get("/v1/stats").json()["jobs"]}
    assert jobs == {f"pid {pid}" for pid in pids}  # each process is its own holder (SO_PEERCRED)

    seconds = released_within(daemon, lambda: os.killpg(pids[0], signal.SIGKILL), 5.0)
    print(f"\nkill -9 of a trainer's process group: pins released after {seconds:.2f} s")


def test_a_leaking_client_cannot_make_another_job_wait(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)], capacity=_capacity(shards, 4), extra_args=["--evict-wait-s", "5"]
    )
    start_holder(holders, daemon, shards[:8], tmp_path)  # opens 8 shards, closes none, stays alive

    client = DaemonClient(daemon.socket)
    other = read_through(client, shards[8:12])
    print(f"\nanother job's 4 shards beside a leaking client: {other:.2f} s")
    assert other < 5.0  # not one open waited --evict-wait-s
    with api(daemon) as http:
        refusals = http.get("/v1/stats").json()["pinned_refusals"]
    assert refusals >= 1  # the leak hit its bound (50% of the cache) and read directly
    stats = client.stats()
    assert stats.hits + stats.misses == 2 + 4  # the leak's 2 pinned shards, then all of this job's
    assert metric(daemon, "shardcache_room_waits_total", 'reason="capacity"') == 0


def test_an_open_that_only_pins_block_is_refused_at_once_and_the_client_reads_directly_a_while(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)], capacity=_capacity(shards, 4), extra_args=["--evict-wait-s", "5"]
    )
    start_holder(holders, daemon, shards[:2], tmp_path, "--plan", "job-a")
    start_holder(holders, daemon, shards[2:4], tmp_path, "--plan", "job-b")  # the cache is pinned

    client = DaemonClient(daemon.socket)
    elapsed = read_through(client, shards[4:8])  # refused once, then read directly without asking
    with api(daemon) as http:
        stats = http.get("/v1/stats").json()
    assert elapsed < 5.0
    assert stats["pinned_refusals"] == 1
    assert {job["job"]: job["leases"] for job in stats["jobs"]} == {"job-a": 2, "job-b": 2}
    assert metric(daemon, "shardcache_refused_opens_total", 'code="cache_pinned"') == 1
    assert (
        metric(daemon, "shardcache_pinned_bytes", 'training_job="job-a"')
        == 2 * Path(shards[0]).stat().st_size
    )
    assert metric(daemon, "shardcache_leases", 'training_job="job-b"') == 2


def test_a_client_without_sessions_is_still_followed_by_its_pid(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    holders: list[subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    # A trainer with a client from before sessions: its requests name none, and the daemon, which sees
    # its pid on the socket, ends its leases when that process exits.
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        capacity=_capacity(shards, 4),
        extra_args=["--max-job-pinned", "100%"],
    )
    pids = start_holder(holders, daemon, shards[:4], tmp_path, "--fork-half", "--without-session")
    with api(daemon) as http:
        stats = http.get("/v1/stats").json()
    assert (stats["sessions"], stats["leases"]) == (0, 4)
    assert {job["job"] for job in stats["jobs"]} == {f"pid {pid}" for pid in pids}

    released_within(daemon, lambda: os.killpg(pids[0], signal.SIGKILL), 5.0)
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="process_exit"') == 4
    assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 0
