"""Open latency: 16 client processes open a cached shard, read its header and close it, in a loop.

Reports p50/p99/max of the time `DaemonClient.open` takes to yield the file (the wait a trainer feels per
shard) and of the whole open/read-header/close cycle, plus opens per second across all processes. Target:
p99 <= 5 ms. Two client variants run in one go: the shipped one (a shard closed at once is released by the
`Shardcache-Release` header of the next open: one request per shard) and one that sends a release request
per shard (answer read during the next open), to show what the header buys. A third variant is the
baseline for the hand-written transport: the same cycle through httpx over the Unix socket
(`httpx.HTTPTransport(uds=...)`, keep-alive, the release sent in the next open's `Shardcache-Release`
header, as the shipped client does), measured in the same run; the ratio of the p50s and p99s is printed.
The processes saturate the machine's cores, as DataLoader workers do. `SHARDCACHED_PROFILE=/tmp/d.prof`
makes the daemon dump a cProfile of its whole run there at exit.

With `--baseline TREE` (a checkout of main: `git worktree add --detach /tmp/open-base main`) only the
shipped variant runs, on this tree and on TREE alternately (`--rounds` each, each a fresh daemon and
clients from that tree: its daemon/, client/ and protocol/ first on the path), and the ratios of the
medians of their p50, p99 and opens/s are printed: the before/after of a change to the hot path.

    .venv/bin/python -m bench.bench_open_latency                             # 16 processes, 5 s per variant
    .venv/bin/python -m bench.bench_open_latency --procs 4 --seconds 1       # quick
    .venv/bin/python -m bench.bench_open_latency --profile                   # cProfile of one client
    .venv/bin/python -m bench.bench_open_latency --baseline /tmp/open-base   # this tree against main
"""

from __future__ import annotations

import argparse
import cProfile
import json
import multiprocessing
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.devservers import start_daemon
from shardcache.daemon_access.daemon_client import DaemonClient

HEADER = 512
# What one run of the shipped variant reports with --json: 16-process latency and rate, and one sequential
# client's CPU per open on each side (less sensitive to a loaded machine than latency).
KEYS = ("p50", "p99", "rate", "client_cpu", "daemon_cpu")


def client_loop(
    socket: str,
    urls: list[str],
    seconds: float,
    release_request: bool,
    start: Any,
    out: Any,
    profile: str | None,
) -> None:
    client = DaemonClient(socket, required=True)
    for url in urls:  # connect and touch every shard before the clock starts
        with client.open(url) as handle:
            handle.read(HEADER)
    profiler = cProfile.Profile() if profile else None
    start.wait()
    opens, cycles = [], []
    deadline = time.perf_counter() + seconds
    index = os.getpid()
    if profiler:
        profiler.enable()
    while (now := time.perf_counter()) < deadline:
        url = urls[index % len(urls)]
        index += 1
        context = client.open(url)
        handle = context.__enter__()
        opened = time.perf_counter()
        handle.read(HEADER)
        context.__exit__(None, None, None)
        if release_request:
            client._transport.flush_releases()  # a release request of its own, as before the header
        cycles.append(time.perf_counter() - now)
        opens.append(opened - now)
    if profiler:
        profiler.disable()
        assert profile is not None
        profiler.dump_stats(profile)
    client.close()
    out.put((opens, cycles))


def httpx_loop(
    socket: str,
    urls: list[str],
    seconds: float,
    release_request: bool,
    start: Any,
    out: Any,
    profile: str | None,
) -> None:
    """The same cycle as `client_loop` with httpx over the Unix socket: the baseline of the transport."""
    import httpx

    client = httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://localhost", timeout=60)
    pending: list[str] = []

    def cycle(url: str) -> float:
        headers = {"Shardcache-Release": ",".join(pending)} if pending else None
        started = time.perf_counter()
        answer = client.post("/v1/shards/open", json={"url": url}, headers=headers)
        answer.raise_for_status()
        grant = answer.json()
        pending.clear()
        with open(grant["path"], "rb") as handle:
            opened = time.perf_counter()
            handle.read(HEADER)
        pending.append(grant["lease"])
        return opened - started

    for url in urls:
        cycle(url)
    profiler = cProfile.Profile() if profile else None
    start.wait()
    opens, cycles = [], []
    deadline = time.perf_counter() + seconds
    index = os.getpid()
    if profiler:
        profiler.enable()
    while (now := time.perf_counter()) < deadline:
        opens.append(cycle(urls[index % len(urls)]))
        index += 1
        cycles.append(time.perf_counter() - now)
    if profiler:
        profiler.disable()
        assert profile is not None
        profiler.dump_stats(profile)
    client.close()
    out.put((opens, cycles))


def run_variant(
    socket: str,
    urls: list[str],
    procs: int,
    seconds: float,
    release_request: bool,
    profile: str | None,
    loop: Any = client_loop,
) -> tuple[np.ndarray, np.ndarray]:
    context = multiprocessing.get_context("fork")
    start = context.Barrier(procs + 1)
    out = context.Queue()
    workers = [
        context.Process(
            target=loop,
            args=(socket, urls, seconds, release_request, start, out, profile if i == 0 else None),
        )
        for i in range(procs)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    results = [out.get(timeout=seconds + 120) for _ in workers]
    for worker in workers:
        worker.join(30)
    opens = np.concatenate([np.asarray(r[0]) for r in results]) * 1e3
    cycles = np.concatenate([np.asarray(r[1]) for r in results]) * 1e3
    return opens, cycles


def cpu_per_open(socket: str, daemon_pid: int, urls: list[str], count: int) -> dict[str, float]:
    """One client alone, sequential: wall and CPU time (ms) per open+release on each side of the socket."""
    import psutil

    daemon = psutil.Process(daemon_pid)
    client = DaemonClient(socket, required=True)
    for url in urls:
        with client.open(url):
            pass
    daemon_before = sum(daemon.cpu_times()[:2])
    client_before, wall_before = time.process_time(), time.perf_counter()
    for i in range(count):
        with client.open(urls[i % len(urls)]) as handle:
            handle.read(HEADER)
    wall = (time.perf_counter() - wall_before) / count * 1e3
    client_cpu = (time.process_time() - client_before) / count * 1e3
    daemon_cpu = (sum(daemon.cpu_times()[:2]) - daemon_before) / count * 1e3
    client.close()
    return {"wall": wall, "client_cpu": client_cpu, "daemon_cpu": daemon_cpu}


def cpu_split(socket: str, daemon_pid: int, urls: list[str], count: int) -> str:
    """`cpu_per_open`, in words."""
    cpu = cpu_per_open(socket, daemon_pid, urls, count)
    return (
        f"one client, sequential: {cpu['wall']:.2f} ms per open+release; CPU per open: client "
        f"{cpu['client_cpu']:.3f} ms, daemon {cpu['daemon_cpu']:.3f} ms"
    )


def describe(name: str, values: np.ndarray) -> str:
    p50, p99 = np.percentile(values, [50, 99])
    return f"{name:<26} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {values.max():7.2f} ms"


def shipped_on(tree: str, args: argparse.Namespace) -> dict[str, float]:
    """The shipped variant measured with `tree`'s daemon and client, in a process of its own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([f"{tree}/daemon", f"{tree}/client", f"{tree}/protocol", os.getcwd()])
    argv = ["--procs", str(args.procs), "--seconds", str(args.seconds), "--shards", str(args.shards)]
    argv += ["--shard-kib", str(args.shard_kib), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_open_latency", *argv],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=args.seconds + 300,
    )
    row: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return row


def compare(baseline: str, args: argparse.Namespace) -> None:
    """This tree against `baseline`, alternating, `args.rounds` runs each (see the module docstring)."""
    trees = {"this": os.getcwd(), "base": baseline}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    print(
        f"open latency, shipped client: {args.procs} client processes on {os.cpu_count()} cores, "
        f"{args.seconds:g} s per run, {args.rounds} runs per tree, alternating"
    )
    for round_number in range(args.rounds):
        for name, tree in trees.items():
            row = shipped_on(tree, args)
            rows[name].append(row)
            print(
                f"  round {round_number + 1} {name}: p50 {row['p50']:5.2f} ms  p99 {row['p99']:5.2f} ms  "
                f"{row['rate']:8,.0f} opens/s; one client's CPU per open: client {row['client_cpu']:.3f} ms, "
                f"daemon {row['daemon_cpu']:.3f} ms   ({tree})",
                flush=True,
            )
    median = {
        name: {key: float(np.median([r[key] for r in got])) for key in got[0]} for name, got in rows.items()
    }
    this, base = median["this"], median["base"]
    print(
        f"medians: this p50 {this['p50']:.2f} ms, p99 {this['p99']:.2f} ms, {this['rate']:,.0f} opens/s; "
        f"base p50 {base['p50']:.2f} ms, p99 {base['p99']:.2f} ms, {base['rate']:,.0f} opens/s"
    )
    print(
        f"this / base: p50 {this['p50'] / base['p50']:.2f}x, p99 {this['p99'] / base['p99']:.2f}x, "
        f"opens/s {this['rate'] / base['rate']:.2f}x; CPU per open: client "
        f"{this['client_cpu'] / base['client_cpu']:.2f}x, "
        f"daemon {this['daemon_cpu'] / base['daemon_cpu']:.2f}x"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Open latency under concurrent client processes.")
    parser.add_argument("--procs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-kib", type=int, default=1024)
    parser.add_argument("--daemon-args", default="", help="extra shardcached flags, space-separated")
    parser.add_argument("--profile", action="store_true", help="cProfile one client process per variant")
    parser.add_argument("--baseline", metavar="TREE", help="a checkout to compare the shipped variant with")
    parser.add_argument("--rounds", type=int, default=3, help="runs per tree with --baseline")
    parser.add_argument("--json", action="store_true", help="the shipped variant only, printed as JSON")
    args = parser.parse_args(argv)
    if args.baseline:
        compare(args.baseline, args)
        return
    work = Path(tempfile.mkdtemp(prefix="scopen-", dir="/tmp"))
    daemon = None
    try:
        source = work / "src"
        source.mkdir()
        urls = []
        for i in range(args.shards):
            path = source / f"shard_{i:04d}.tar"
            path.write_bytes(os.urandom(args.shard_kib * 1024))
            urls.append(str(path))
        daemon = start_daemon(
            work / "d.sock",
            work / "cache",
            [str(source)],
            capacity="1GiB",
            extra_args=args.daemon_args.split(),
            log=work / "daemon.log",
        )
        with DaemonClient(daemon.socket, required=True) as client:  # warm every shard
            for url in urls:
                with client.open(url):
                    pass
        if args.json:
            cpu = cpu_per_open(daemon.socket, daemon.process.pid, urls, 2000)
            opens, _ = run_variant(daemon.socket, urls, args.procs, args.seconds, False, None)
            p50, p99 = np.percentile(opens, [50, 99])
            row = {"p50": p50, "p99": p99, "rate": len(opens) / args.seconds, **cpu}
            print(json.dumps({key: float(value) for key, value in row.items()}))
            return
        print(
            f"open latency: {args.procs} client processes on {os.cpu_count()} cores, {args.shards} cached "
            f"shards, {args.seconds:g} s per variant"
        )
        print(cpu_split(daemon.socket, daemon.process.pid, urls, 1000))
        variants = (
            ("release on next open", False, client_loop),
            ("release request per open", True, client_loop),
            ("httpx over the socket, release on next open", False, httpx_loop),
        )
        results = {}
        for number, (label, release_request, loop) in enumerate(variants):
            profile = str(work / f"profile-{number}.out") if args.profile else None
            opens, cycles = run_variant(
                daemon.socket, urls, args.procs, args.seconds, release_request, profile, loop
            )
            results[label] = opens
            print(f"[{label}] {len(opens) / args.seconds:,.0f} opens/s")
            print("  " + describe("open (until file yielded)", opens))
            print("  " + describe("open + header + close", cycles))
            if profile:
                pstats.Stats(profile).sort_stats("cumulative").print_stats(18)
        ours = np.percentile(results[variants[0][0]], [50, 99])
        theirs = np.percentile(results[variants[2][0]], [50, 99])
        print(
            f"httpx / hand-written transport, open latency: p50 {theirs[0] / ours[0]:.1f}x, "
            f"p99 {theirs[1] / ours[1]:.1f}x"
        )
        print("target: p99 of open <= 5 ms")
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
