"""A trainer killed while holding shards, and a client that never closes them: what another job pays.

A cache of 10 shards; a trainer process (harness/lease_holder.py) opens 10 shards under its plan and
blocks. Three runs, each on a fresh daemon with default settings (`--evict-wait-s 10`, `--lease-ttl-s
300`, `--max-job-pinned 50%`):

- baseline: another job reads 10 other shards through the daemon, nobody else on the node;
- killed: the trainer is killed (`kill -9`); the seconds until the daemon shows no pinned shard, and the
  other job's time, started right after the kill;
- leak: the trainer stays alive holding its shards; the other job's time.

Then where the trainer runs, as a DaemonSet pod and a trainer pod do: a trainer with 2 DataLoader worker
processes (harness/loader_holder.py: it holds one shard, each worker two) is killed with `kill -9` of its
process group, and the seconds until the daemon shows no pinned shard are measured (`--repeats` times,
median and worst), first with daemon and trainer in the same namespaces, then each in PID, mount and UTS
namespaces of its own, the socket directory bind-mounted into each at a different path (needs root or
user namespaces). The daemon sees no pid of a trainer in another PID namespace; target: released within
5 s. `--give-up-s` bounds the wait (a daemon that only has the lease TTL would take 300 s). With
`--baseline TREE` the namespace runs are also made with TREE's daemon and client (its daemon/, client/ and
protocol/ first on the path, in a process of its own), in the same run.

    .venv/bin/python -m bench.bench_dead_holder
    .venv/bin/python -m bench.bench_dead_holder --baseline /tmp/main-tree --give-up-s 60
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import shardcache
from harness.daemon_api import api
from harness.devservers import Daemon, start_daemon
from harness.namespaces import in_namespaces, require_namespaces, stop_namespaced
from shardcache.daemon_access.daemon_client import DaemonClient

HOLDER = Path(__file__).parents[1] / "harness" / "lease_holder.py"
LOADER_HOLDER = Path(__file__).parents[1] / "harness" / "loader_holder.py"
Times = dict[str, list[float | None]]  # namespace layout -> seconds until released (None: gave up)


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


def released_after(work: Path, urls: list[str], separate: bool, give_up_s: float) -> float | None:
    """Seconds from `kill -9` of a trainer pod (trainer and 2 DataLoader workers) until no shard is pinned;
    None past `give_up_s`. `separate`: daemon and trainer each in namespaces of their own."""
    run = work / f"run-{time.monotonic_ns()}"
    host, daemon_view, trainer_view = run / "run", run / "d", run / "t"
    for folder in (host, daemon_view, trainer_view):
        folder.mkdir(parents=True)
    unshare = require_namespaces() if separate else ""
    daemon = start_daemon(
        daemon_view / "s.sock" if separate else host / "s.sock",
        run / "cache",
        [str(work / "remote")],
        reach_at=host / "s.sock",
        wrapper=in_namespaces(unshare, binds=[(host, daemon_view)]) if separate else (),
        log=run / "daemon.log",
    )
    pod = in_namespaces(unshare, binds=[(host, trainer_view)], hostname="trainer-0") if separate else []
    ready = run / "ready"
    socket = (trainer_view if separate else host) / "s.sock"
    trainer = subprocess.Popen(
        [*pod, sys.executable, str(LOADER_HOLDER), str(socket), str(ready), *urls], start_new_session=True
    )
    try:
        while not ready.exists():
            if trainer.poll() is not None:
                raise RuntimeError("the trainer exited before it held its shards")
            time.sleep(0.02)
        killed_at = time.monotonic()
        os.killpg(trainer.pid, signal.SIGKILL)
        while pinned(daemon):
            if time.monotonic() - killed_at > give_up_s:
                return None
            time.sleep(0.02)
        return time.monotonic() - killed_at
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
        if separate:
            stop_namespaced(daemon)
        else:
            daemon.stop()


def release_times(work: Path, urls: list[str], repeats: int, give_up_s: float) -> Times:
    """`released_after` `repeats` times, in the same namespaces and in separate ones, alternating."""
    times: Times = {"same": [], "separate": []}
    for _ in range(repeats):
        for mode in times:
            times[mode].append(released_after(work, urls, mode == "separate", give_up_s))
    return times


def release_times_on(tree: str, args: argparse.Namespace) -> Times:
    """`release_times` with `tree`'s daemon and client, in a process of its own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([f"{tree}/daemon", f"{tree}/client", f"{tree}/protocol", os.getcwd()])
    argv = ["--repeats", str(args.repeats), "--give-up-s", str(args.give_up_s), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_dead_holder", *argv],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    times: dict[str, list[float | None]] = json.loads(done.stdout.splitlines()[-1])
    return times


def describe(times: list[float | None], give_up_s: float) -> str:
    if any(seconds is None for seconds in times):
        held = sum(seconds is None for seconds in times)
        return f"> {give_up_s:g} s in {held} of {len(times)} runs (still pinned when the wait gave up)"
    known = [seconds for seconds in times if seconds is not None]
    return f"median {statistics.median(known):6.3f} s, worst {max(known):6.3f} s ({len(known)} runs)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shard-kib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5, help="kills per namespace layout")
    parser.add_argument("--give-up-s", type=float, default=60.0, help="longest wait for a release")
    parser.add_argument("--baseline", metavar="TREE", help="a checkout whose namespace runs are made too")
    parser.add_argument("--json", action="store_true", help="only the namespace runs, printed as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sc-dh-", dir="/tmp") as tmp:
        work = Path(tmp)
        (work / "remote").mkdir()
        urls = []
        for i in range(5):
            path = work / "remote" / f"shard_{i:06d}.bin"
            path.write_bytes(os.urandom(args.shard_kib * 1024))
            urls.append(str(path))
        if args.json:
            print(json.dumps(release_times(work, urls, args.repeats, args.give_up_s)))
            return 0
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
    trees = {"this": os.getcwd(), **({"base": args.baseline} if args.baseline else {})}
    print("a trainer pod (trainer + 2 DataLoader workers, 5 shards pinned) killed -9: seconds until released")
    for name, tree in trees.items():
        times = release_times_on(tree, args)
        print(f"  {name} ({tree}):")
        print(f"    same namespaces as the daemon        {describe(times['same'], args.give_up_s)}")
        print(f"    separate PID+mount+UTS namespaces    {describe(times['separate'], args.give_up_s)}")
    print("  target: separate namespaces released within 5 s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
