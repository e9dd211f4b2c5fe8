"""A trainer pod beside the daemon's pod: a killed trainer's pins are released within seconds.

Deployed as on Kubernetes without hostPID: the daemon runs in PID, mount and UTS namespaces of its own,
and so does the trainer (host name `trainer-0`, like a pod). The socket directory is a host directory
each of them bind-mounts at its own path (a hostPath volume), so the trainer reaches the socket at another
path than the daemon binds it, and the daemon sees no pid of the trainer (`SO_PEERCRED` gives 0). The
trainer is harness/loader_holder.py: it holds a shard itself and a DataLoader with 2 real worker processes
holds the others. `kill -9` of its process group must end every pin within seconds, the lease TTL staying
at its 300 s default. Run with the trainer mounting the daemon's cache directory (the client opens the
cached files) and without (it streams them over the socket).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.namespaces import in_namespaces, require_namespaces, stop_namespaced
from harness.polling import wait_for
from harness.shards import make_tar_shard

HOLDER = Path(__file__).parents[2] / "harness" / "loader_holder.py"
SOCKET_NAME = "shardcache.sock"
TRAINER_HOST = "trainer-0"


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    folder = tmp_path / "tars"
    folder.mkdir()
    for i in range(5):  # one held by the trainer itself, two by each worker
        make_tar_shard(folder / f"shard_{i:06d}.tar", i, samples=2, payload_bytes=32 * 1024)
    return sorted(str(path) for path in folder.iterdir())


def pinned_shards(daemon: Daemon) -> int:
    with api(daemon) as http:
        return sum(shard["pinned"] for shard in http.get("/v1/shards").json()["shards"])


@pytest.mark.parametrize("cache_mounted", [True, False], ids=["cache-mounted", "streamed"])
@pytest.mark.timeout(300)
def test_kill_9_of_a_trainer_pod_with_dataloader_workers_releases_its_pins_within_seconds(
    daemon_factory: Callable[..., Daemon],
    shards: list[str],
    short_tmp: Path,
    tmp_path: Path,
    cache_mounted: bool,
) -> None:
    unshare = require_namespaces()
    host_run, daemon_run, trainer_run = (short_tmp / name for name in ("run", "d", "t"))
    for folder in (host_run, daemon_run, trainer_run):
        folder.mkdir()
    daemon = daemon_factory(
        allow=[str(Path(shards[0]).parent)],
        extra_args=["--max-job-pinned", "100%"],
        socket_path=daemon_run / SOCKET_NAME,
        reach_at=host_run / SOCKET_NAME,
        wrapper=in_namespaces(unshare, binds=[(host_run, daemon_run)]),
    )
    ready = tmp_path / "ready"
    pod = in_namespaces(
        unshare,
        binds=[(host_run, trainer_run)],
        hidden=[] if cache_mounted else [daemon.cache_dir],
        hostname=TRAINER_HOST,
    )
    command = [*pod, sys.executable, str(HOLDER), str(trainer_run / SOCKET_NAME), str(ready), *shards]
    trainer = subprocess.Popen(command, start_new_session=True)  # its process group: the whole pod
    try:
        wait_for(lambda: ready.exists() or trainer.poll() is not None, "the trainer to hold its shards", 120)
        assert trainer.poll() is None, "the trainer exited"
        members = [line.split() for line in ready.read_text().splitlines()]
        assert len(members) == 3 and {host for _, host in members} == {TRAINER_HOST}
        assert pinned_shards(daemon) == 5
        with api(daemon) as http:
            stats = http.get("/v1/stats").json()
        assert stats["sessions"] == 3  # the trainer and each worker: one session per process
        jobs = {job["job"] for job in stats["jobs"]}
        assert {f"pid {pid} on {TRAINER_HOST}" for pid, _ in members} <= jobs  # pids as the pod sees them

        started = time.monotonic()
        os.killpg(trainer.pid, signal.SIGKILL)
        wait_for(lambda: pinned_shards(daemon) == 0, "the killed trainer's pins to be released", 5.0)
        seconds = time.monotonic() - started
        mode = "cached files" if cache_mounted else "streamed"
        print(f"\nkill -9 of a trainer pod ({mode}): pins released after {seconds:.2f} s")
        assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="session_closed"') == 5
        assert metric(daemon, "shardcache_abandoned_leases_total", 'reason="ttl"') == 0
        with api(daemon) as http:
            assert http.get("/v1/stats").json()["sessions"] == 0
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait(30)
        assert stop_namespaced(daemon) == 0
