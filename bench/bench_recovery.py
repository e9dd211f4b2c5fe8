"""Daemon start-up on a full cache directory: time until `/v1/health` answers, and peak RSS.

A restarted daemon rebuilds its index from the files in its cache directory (recovery.py) before it binds
its listeners, so a Kubernetes startupProbe must allow that long. This builds cache directories of N
resident shards the way the daemon writes them (the store's own names and meta records: `Entry`,
`cache_key`, `file_suffix`, `Entry.meta_record`; the data files are empty, since recovery reads only
their sizes), starts `shardcached` on each, and times from the process start until `GET /v1/health` on the
metrics listener answers 200, sampling the daemon's RSS meanwhile. The baseline is the same start on a
directory of 1,000 shards, measured in the same run.

With `--plans P`, P plans are then registered over the resident shards (P/2 slots, their current and next
epochs, each epoch a fresh shuffle dealt across the slots: the shape of bench_scale_evict's 64 plans), and
the RSS is sampled until it settles: the daemon's memory at that scale with plans.

    .venv/bin/python -m bench.bench_recovery                                  # 10^3, 10^5, 10^6 resident
    .venv/bin/python -m bench.bench_recovery --sizes 1000 100000 --plans 64   # with 64 plans
    .venv/bin/python -m bench.bench_recovery --drop-caches                    # cold caches, as after a reboot

The built directories stay under `--work` for later runs (`--keep`); without it they are removed.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import psutil

from harness.devservers import free_tcp_port, stop_process
from shardcached.keys import cache_key, file_suffix
from shardcached.storage.layout import META_SUFFIX, Entry

BUCKET = "s3://bench-recovery"
BASELINE = 1000


def build_cache_dir(cache_dir: Path, n: int) -> None:
    """`n` resident shards laid out as the daemon publishes them (no fsync: a fixture, not a store)."""
    stamp = cache_dir / f".bench-built-{n}"
    if stamp.exists():
        return
    shutil.rmtree(cache_dir, ignore_errors=True)
    cache_dir.mkdir(parents=True)
    for i in range(n):
        url = f"{BUCKET}/train/shard-{i:07d}.tar"
        version = f'"{i:032x}"'  # an ETag
        key = cache_key(url, version)
        entry = Entry(key=key, url=url, version=version, size=0, path=cache_dir / (key + file_suffix(url)))
        entry.path.touch()
        (cache_dir / (key + META_SUFFIX)).write_text(json.dumps(entry.meta_record()))
    stamp.touch()


@dataclass
class Start:
    n: int
    ready_s: float
    cpu_s: (
        float  # the daemon's CPU time (user + system) until ready: what the machine's load does not inflate
    )
    peak_rss: int
    ready_rss: int
    plans_rss: int | None = None
    plans_s: float | None = None


def _health_ok(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/v1/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class RssSampler:
    """Peak RSS of one process, sampled every `interval_s` in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.02) -> None:
        self._proc = psutil.Process(pid)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.peak = 0
        self.last = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.last = self._proc.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, self.last)
            self._stop.wait(self._interval_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def _register_plans(socket: str, n: int, plans: int) -> None:
    """`plans` plans over the `n` resident urls: plans/2 slots x (epoch 0, epoch 1), each epoch dealt."""
    slots = max(1, plans // 2)
    rng = np.random.default_rng(0)
    urls = np.array([f"{BUCKET}/train/shard-{i:07d}.tar" for i in range(n)], dtype=object)
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://d", timeout=900) as http:
        for epoch in (0, 1):
            order = urls[rng.permutation(n)]
            for slot in range(slots):
                body = {"job": "bench", "slot": slot, "epoch": epoch, "urls": order[slot::slots].tolist()}
                http.post("/v1/plans", json=body).raise_for_status()


def _settle(sampler: RssSampler, quiet_s: float = 5.0, deadline_s: float = 600.0) -> None:
    """Wait until the RSS stopped growing for `quiet_s` (the plans' background indexing is done)."""
    deadline = time.monotonic() + deadline_s
    seen, since = sampler.last, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if sampler.last > seen * 1.005:
            seen, since = sampler.last, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise TimeoutError("the daemon's RSS did not settle")


def start_daemon_on(cache_dir: Path, work: Path, plans: int, n: int, drop_caches: bool) -> Start:
    port = free_tcp_port()
    socket = str(work / "d.sock")
    if drop_caches:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # page cache, dentries, inodes: a rebooted node
    args = [
        sys.executable, "-m", "shardcached", "--socket", socket, "--cache-dir", str(cache_dir),
        "--capacity", "90%", "--min-free", "0", "--metrics-addr", f"127.0.0.1:{port}",
        "--allow", BUCKET, "--prefetch-depth", "0", "--log-level", "WARNING",
    ]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(work / "daemon.log", "ab"))  # noqa: SIM115
    sampler = RssSampler(proc.pid)
    try:
        deadline = started + 1800
        while not _health_ok(port):
            if proc.poll() is not None:
                raise RuntimeError(f"shardcached exited with {proc.returncode}; see {work / 'daemon.log'}")
            if time.perf_counter() > deadline:
                raise TimeoutError("shardcached did not answer /v1/health within 30 minutes")
            time.sleep(0.02)
        ready_s = time.perf_counter() - started
        times = psutil.Process(proc.pid).cpu_times()
        result = Start(n, ready_s, times.user + times.system, sampler.peak, sampler.last)
        if plans:
            begun = time.perf_counter()
            _register_plans(socket, n, plans)
            _settle(sampler)
            result.plans_s = time.perf_counter() - begun
            result.plans_rss = sampler.peak
        return result
    finally:
        stop_process(proc, 120)
        sampler.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--plans", type=int, default=0, help="plans registered after the start (0: none)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work", type=Path, default=Path("/tmp/sc-bench-recovery"))
    parser.add_argument("--keep", action="store_true", help="keep the built cache directories")
    parser.add_argument(
        "--drop-caches", action="store_true", help="drop the kernel's caches before each start (root)"
    )
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results: list[Start] = []
    try:
        for n in [BASELINE, *args.sizes]:
            cache_dir = args.work / f"cache-{n}"
            began = time.perf_counter()
            build_cache_dir(cache_dir, n)
            print(f"cache dir of {n} shards ready in {time.perf_counter() - began:.1f} s", flush=True)
            for _ in range(args.repeats):
                result = start_daemon_on(cache_dir, args.work, args.plans, n, args.drop_caches)
                results.append(result)
                plans = (
                    f"  with {args.plans} plans: peak RSS {result.plans_rss / 1e6:.0f} MB "
                    f"(registered and settled in {result.plans_s:.1f} s)"
                    if result.plans_rss is not None and result.plans_s is not None
                    else ""
                )
                print(
                    f"{n:>9} shards: /v1/health ok after {result.ready_s:7.2f} s "
                    f"({result.cpu_s:.2f} s CPU), peak RSS "
                    f"{result.peak_rss / 1e6:6.0f} MB (at ready {result.ready_rss / 1e6:.0f} MB){plans}",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    base = min((r for r in results if r.n == BASELINE), key=lambda r: r.ready_s)
    for n in args.sizes:
        best = min((r for r in results if r.n == n), key=lambda r: r.ready_s)
        print(
            f"{n}/{BASELINE}: start {best.ready_s / base.ready_s:.1f}x ({best.ready_s:.2f} s against "
            f"{base.ready_s:.2f} s; CPU {best.cpu_s:.2f} s against {base.cpu_s:.2f} s), peak RSS "
            f"{best.peak_rss / base.peak_rss:.1f}x "
            f"({best.peak_rss / 1e6:.0f} MB against {base.peak_rss / 1e6:.0f} MB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
