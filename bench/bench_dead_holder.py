"""A trainer killed while holding shards, and a client that never closes them: what another job pays.

A cache of 10 shards; a trainer process (harness/lease_holder.py) opens 10 shards under its plan and
blocks. Three runs, each on a fresh daemon with default settings (`--evict-wait-s 10`, `--lease-ttl-s
300`, `--max-job-pinned 50%`):

- baseline: another job reads 10 other shards through the daemon, nobody else on the node;
- killed: the trainer is killed (`kill -9`); the seconds until the daemon shows no pinned shard, and the
  other job's time, started right after the kill;
- leak: the trainer stays alive holding its shards; the other job's time.

    .venv/bin/python -m bench.bench_dead_holder
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import shardcache
from harness.daemon_api import api
from harness.devservers import Daemon, start_daemon
from shardcache.daemon_access.daemon_client import DaemonClient

HOLDER = Path(__file__).parents[1] / "harness" / "lease_holder.py"


def pinned(daemon: Daemon) -> int:
    with api(daemon) as http:
        return sum(shard["pinned"] for shard in http.get("/v1/shards").json()["shards"])


def read_through(socket: str, urls: list[str]) -> float:
    client = DaemonClient(socket)
    started = time.monotonic()
    for url in urls:
        with client.open(url) as handle:
            handle.read()
    return time.monotonic() - started


def hold(daemon: Daemon, urls: list[str], ready: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), daemon.socket, str(ready), *urls, "--plan", "trainer"],
        start_new_session=True,
    )
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError("the holder exited before it held its shards")
        time.sleep(0.02)
    return proc


def run(work: Path, urls: list[str], mode: str, capacity: str) -> tuple[float, float | None]:
    """(the other job's seconds, seconds until the killed trainer's pins were released)."""
    daemon = start_daemon(
        work / f"{mode}.sock", work / f"cache-{mode}", [str(work / "remote")], capacity=capacity,
        log=work / f"{mode}.log",
    )  # fmt: skip
    holder = None
    try:
        released: float | None = None
        if mode != "baseline":
            holder = hold(daemon, urls[:10], work / f"ready-{mode}")
        if mode == "killed" and holder is not None:
            killed_at = time.monotonic()
            os.killpg(holder.pid, signal.SIGKILL)
            timing: list[float] = []
            other = threading.Thread(target=lambda: timing.append(read_through(daemon.socket, urls[10:])))
            other.start()
            while pinned(daemon):
                if time.monotonic() - killed_at > 400:
                    raise TimeoutError("pins still held 400 s after the kill")
                time.sleep(0.02)
            released = time.monotonic() - killed_at
            other.join()
            return timing[0], released
        return read_through(daemon.socket, urls[10:]), released
    finally:
        if holder is not None and holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
        if holder is not None:
            holder.wait()
        daemon.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shard-kib", type=int, default=1024)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sc-dh-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "remote").mkdir()
        urls = []
        for i in range(20):
            path = work / "remote" / f"shard_{i:06d}.bin"
            path.write_bytes(os.urandom(args.shard_kib * 1024))
            urls.append(str(path))
        capacity = f"{10 * args.shard_kib * 1024 + 512}B"
        baseline, _ = run(work, urls, "baseline", capacity)
        killed, released = run(work, urls, "killed", capacity)
        leak, _ = run(work, urls, "leak", capacity)
    print(f"cache of 10 shards of {args.shard_kib} KiB; a trainer holds 10; another job reads 10 others")
    print(f"  code under test: {Path(shardcache.__file__).parent}")
    print(f"  killed trainer's pins released after {released:8.3f} s  (lease TTL 300 s)")
    print(f"  other job, baseline              {baseline:8.3f} s")
    print(f"  other job, trainer killed -9     {killed:8.3f} s  ({killed / baseline:.2f}x)")
    print(f"  other job, beside a leak         {leak:8.3f} s  ({leak / baseline:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
