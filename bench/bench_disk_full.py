"""A cache filesystem that a neighbour filled: reading through the daemon against reading directly.

Reproduces a user's report: a neighbour left 3 MiB free on the filesystem of the cache directory (the
daemon's capacity not reached), and two jobs read 12 shards of 4 MiB each. Every shard must then be read
directly; the question is how long the daemon makes each open wait before it says so. Two readers (threads,
one `DaemonClient` each, as two jobs have) read the 12 shards through the daemon, then the same two read
them directly (`open_direct`), in the same run; the ratio of the wall times is what to read. The shards'
"remote" is a local directory, so the direct read is fast and the ratio is the daemon's overhead at its
worst. Needs root (it mounts a tmpfs for the cache).

    .venv/bin/python -m bench.bench_disk_full                     # 12 shards of 4 MiB, 3 MiB free
    .venv/bin/python -m bench.bench_disk_full --repeats 1          # once (the code before the fix took 2 min)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import shardcache
from harness.daemon_api import metric
from harness.devservers import start_daemon
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.daemon_access.direct import open_direct

MIB = 1024 * 1024


def write_shards(folder: Path, count: int, size: int) -> list[str]:
    paths = []
    for i in range(count):
        path = folder / f"shard_{i:06d}.tar"
        path.write_bytes(os.urandom(size))
        paths.append(str(path))
    return paths


Opener = Callable[[str], contextlib.AbstractContextManager[BinaryIO]]


def read_all(urls: list[str], opener: Opener) -> int:
    total = 0
    for url in urls:
        with opener(url) as handle:
            total += len(handle.read())
    return total


def two_readers(urls: list[str], make_opener: Callable[[], Opener]) -> float:
    """Seconds for two readers, each with its own opener, to read every shard once."""
    openers = [make_opener() for _ in range(2)]
    threads = [threading.Thread(target=read_all, args=(urls, opener)) for opener in openers]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--shard-mib", type=int, default=4)
    parser.add_argument("--free-mib", type=float, default=3.0, help="free space the neighbour leaves")
    parser.add_argument("--evict-wait-s", type=float, default=10.0, help="the daemon's --evict-wait-s")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each; the best is reported")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_disk_full skipped: it needs root to mount a tmpfs for the cache", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="sc-df-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "remote").mkdir()
        urls = write_shards(work / "remote", args.shards, args.shard_mib * MIB)
        mount = work / "small"
        mount.mkdir()
        size_mib = args.shard_mib * 4 + int(args.free_mib) + 4
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount)], check=True)
        try:
            fs = os.statvfs(mount)
            (mount / "neighbour.bin").write_bytes(
                b"n" * (fs.f_bavail * fs.f_frsize - int(args.free_mib * MIB))
            )
            daemon = start_daemon(
                work / "d.sock",
                mount / "cache",
                [str(work / "remote")],
                capacity="1GiB",
                extra_args=["--evict-wait-s", str(args.evict_wait_s), "--min-free", "0"],
                log=work / "daemon.log",
            )
            try:
                # New clients each run, as new jobs: each asks the daemon for its first shard.
                through = min(
                    two_readers(urls, lambda: DaemonClient(daemon.socket).open) for _ in range(args.repeats)
                )
                refused = metric(daemon, "shardcache_refused_opens_total", 'code="cache_disk_full"')
                waits = metric(daemon, "shardcache_room_waits_total", 'reason="disk_full"')
            finally:
                daemon.stop()
            direct = min(two_readers(urls, lambda: open_direct) for _ in range(args.repeats))
        finally:
            subprocess.run(["umount", "-l", str(mount)], check=False)
    print(
        f"disk full of other files: {args.free_mib:g} MiB free, 2 readers x {args.shards} shards of "
        f"{args.shard_mib} MiB, --evict-wait-s {args.evict_wait_s:g}, best of {args.repeats}"
    )
    print(f"  code under test: {Path(shardcache.__file__).parent}")
    print(
        f"  through the daemon {through:8.3f} s  (refused opens {refused:.0f}, opens that waited {waits:.0f})"
    )
    print(f"  direct             {direct:8.3f} s")
    print(f"  ratio              {through / direct:8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
