"""What checking a beginning job's cached shards against the remote costs (daemon/shardcached/freshness.py),
at 10^3, 10^4 and 10^5 resident shards, against a moto S3 endpoint that counts the requests it serves.

Setup, not timed: moto runs in a process of its own that counts the requests it serves by kind (list,
head, get: bench/counting_s3.py); N tiny objects go straight into moto's backend (10^5 puts through the S3
API take minutes);
the daemon's cache directory is written directly (each shard's data file and meta, the layout the daemon
recovers at start), so the daemon starts with N resident shards it has never confirmed.

Measured per N, the daemon with `--prefetch-depth 0` (only the checks reach moto):

- a job begins (the daemon's S3 client warmed by one open of another object first): `POST /v1/plans` with
  the N urls shuffled, then at once an open of the plan's first shard:
  the registration's answer time, the first open's delay, then the next 32 opens in plan order while the
  check runs (median, longest), the time until every copy is checked (`shardcache_validation_pending_shards`
  at 0 and N validations counted), and the requests moto served meanwhile;
- the first open under an immutable plan of another job (nothing to check): a plain hit's latency;
- the daemon's memory: resident before the plan arrives, and its peak from then until every copy is
  checked (registering the plan, gathering and checking its copies);
- baseline, a HEAD each: min(N, --head-sample) HEADs of those objects with the daemon's own `Fetcher.info`
  from 4 threads (the daemon's 4 validation workers) in another process, extrapolated linearly to N;
- for scale, one request alone, from that process: a HEAD, and a listing page of 1,000 objects (what an
  open whose page is in flight waits for at most; moto renders a page far slower than S3 does).

    .venv/bin/python -m bench.bench_validation --sizes 1000 10000 100000
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

from harness.daemon_api import api, metric
from harness.devservers import S3_TEST_CREDENTIALS, Daemon, free_tcp_port, start_daemon, stop_process
from shardcached.keys import cache_key

BUCKET = "bench-validation"
FOLLOWING_OPENS = 32


class CountingEndpoint:
    """moto's S3 in a process of its own, counting the requests it serves (bench/counting_s3.py)."""

    def __init__(self) -> None:
        self.port = free_tcp_port()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.counting_s3", "--port", str(self.port)],
            stdout=subprocess.PIPE,
            env={**os.environ, **S3_TEST_CREDENTIALS},
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().decode()  # "ready <port>", once it serves
        if not line.startswith("ready"):
            raise RuntimeError(f"the counting S3 endpoint did not start: {line!r}")
        self._http = httpx.Client(base_url=self.endpoint, timeout=600)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put(self, urls: list[str]) -> None:
        """Tiny objects straight into moto's backend, each holding its key (`body`)."""
        keys = "\n".join(url.removeprefix(f"s3://{BUCKET}/") for url in urls)
        self._http.post("/_bench/objects", params={"bucket": BUCKET}, content=keys).raise_for_status()

    def snapshot(self) -> collections.Counter[str]:
        counts = self._http.get("/_bench/counts").raise_for_status().json()
        return collections.Counter({kind: int(count) for kind, count in counts.items()})

    def stop(self) -> None:
        self._http.close()
        stop_process(self._process)


def body(url: str) -> bytes:
    """What the object of `url` holds (bench/counting_s3.py puts each key as its own bytes)."""
    return url.removeprefix(f"s3://{BUCKET}/").encode()


def write_cache(cache_dir: Path, urls: list[str]) -> None:
    """Each shard's data file and meta, as the daemon writes them (layout.py), never confirmed; the
    version is the object's ETag, the MD5 of its bytes."""
    cache_dir.mkdir(parents=True)
    for url in urls:
        data = body(url)
        version = hashlib.md5(data).hexdigest()  # noqa: S324 - S3's ETag of a simple upload
        key = cache_key(url, version)
        (cache_dir / f"{key}.tar").write_bytes(data)
        meta = {"url": url, "version": version, "size": len(data), "checksum": None, "file": f"{key}.tar"}
        (cache_dir / f"{key}.meta.json").write_text(json.dumps(meta))


def open_ms(http: httpx.Client, url: str, plan: str) -> float:
    started = time.perf_counter()
    grant = http.post("/v1/shards/open", json={"url": url, "plan": plan}).raise_for_status().json()
    waited = (time.perf_counter() - started) * 1000
    http.post("/v1/shards/release", json={"lease": grant["lease"]}).raise_for_status()
    return waited


def reset_peak(daemon: Daemon) -> None:
    """Start the daemon's peak resident memory (VmHWM) over from what it holds now (Linux, own process or
    root)."""
    Path(f"/proc/{daemon.process.pid}/clear_refs").write_text("5")


def memory_mb(daemon: Daemon) -> tuple[float, float]:
    """The daemon's resident memory now and its peak since `reset_peak` (VmRSS, VmHWM), in MB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{daemon.process.pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def checked(daemon: Daemon) -> float:
    return sum(
        metric(daemon, "shardcache_validations_total", f'result="{result}"')
        for result in ("unchanged", "changed", "missing")
    )


HEADS = textwrap.dedent(
    """
    import statistics, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from shardcached.fetching.fetcher import Fetcher
    from shardcached.versions import RemoteVersions

    urls = sys.stdin.read().split()
    fetcher = Fetcher()
    fetcher.info(urls[0])  # build the S3 client first, as the daemon does at start

    def timed(call):
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    head = statistics.median(timed(lambda: fetcher.info(urls[0])) for _ in range(9))
    pages = RemoteVersions(fetcher)
    page = statistics.median(timed(lambda: pages.page(urls, None, threading.Event())) for _ in range(5))
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(fetcher.info, urls))
    print(time.perf_counter() - started, head, page)
    """
)


def heads_seconds(urls: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Seconds for one HEAD of each url, 4 at a time, in another process; and one HEAD's and one listing
    page's seconds, each alone (medians)."""
    done = subprocess.run(
        [sys.executable, "-c", HEADS],
        input="\n".join(urls),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    each, head, page = (float(word) for word in done.stdout.split()[-3:])
    return each, head, page


def measure(n: int, endpoint: CountingEndpoint, root: Path, head_sample: int, seed: int) -> dict[str, float]:
    urls = [f"s3://{BUCKET}/n{n}/shard_{i:07d}.tar" for i in range(n)]
    warm = f"s3://{BUCKET}/n{n}/warm-up.tar"
    endpoint.put([*urls, warm])
    cache = root / f"cache-{n}"
    write_cache(cache, urls)
    env = {
        **S3_TEST_CREDENTIALS,
        "AWS_ENDPOINT_URL_S3": endpoint.endpoint,
        "AWS_ENDPOINT_URL": endpoint.endpoint,
    }
    daemon = start_daemon(
        root / f"d{n}.sock",
        cache,
        [f"s3://{BUCKET}"],
        capacity="100GiB",
        extra_args=["--prefetch-depth", "0", "--min-free", "0"],
        env=env,
        deadline_s=600,
        log=root / f"daemon-{n}.log",
    )
    row: dict[str, float] = {"n": n}
    try:
        order = urls[:]
        random.Random(seed).shuffle(order)
        with api(daemon, timeout=600) as http:
            # A daemon that has served before: its S3 client's first request (a second or more here, cold
            # connection and botocore's lazy set-up) is not what a job's check costs.
            http.post("/v1/shards/open", json={"url": warm}).raise_for_status()
            before = endpoint.snapshot()
            reset_peak(daemon)
            row["rss_mb"] = memory_mb(daemon)[0]
            started = time.perf_counter()
            plan = http.post("/v1/plans", json={"job": "begins", "slot": 0, "epoch": 0, "urls": order})
            plan_id = plan.raise_for_status().json()["plan"]
            row["register_s"] = time.perf_counter() - started
            row["first_open_ms"] = open_ms(http, order[0], plan_id)
            following = [open_ms(http, url, plan_id) for url in order[1 : 1 + FOLLOWING_OPENS]]
            row["next_median_ms"] = statistics.median(following)
            row["next_max_ms"] = max(following)
            while checked(daemon) < n or metric(daemon, "shardcache_validation_pending_shards") > 0:
                time.sleep(0.05)  # polling the daemon's counters, not waiting for readiness blindly
            row["check_s"] = time.perf_counter() - started
            row["peak_mb"] = memory_mb(daemon)[1]
            sent = endpoint.snapshot() - before
            row.update({op: float(sent[op]) for op in ("list", "head", "get")})
            frozen = http.post(
                "/v1/plans",
                json={"job": "frozen", "slot": 0, "epoch": 0, "urls": order, "immutable": True},
            ).raise_for_status()
            row["immutable_first_open_ms"] = open_ms(http, order[-1], frozen.json()["plan"])
    finally:
        daemon.stop()
    sample = urls[: min(n, head_sample)]
    each, head, page = heads_seconds(sample, {**os.environ, **env})
    row["heads_s"] = each * n / len(sample)
    row["heads_sampled"] = float(len(sample))
    row["one_head_ms"], row["one_page_ms"] = head * 1000, page * 1000
    shutil.rmtree(cache, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_validation", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--head-sample", type=int, default=10_000, help="HEADs timed for the baseline")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    endpoint = CountingEndpoint()
    root = Path(tempfile.mkdtemp(prefix="bv-", dir="/tmp"))
    rows = []
    try:
        for n in args.sizes:
            rows.append(measure(n, endpoint, root, args.head_sample, args.seed))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        endpoint.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{'shards':>7} {'register':>9} {'1st open':>9} {'next 32':>15} {'checked in':>11} "
        f"{'list':>5} {'head':>5} {'get':>4} {'HEAD each':>10} {'requests':>9} {'time':>6} {'hit':>8} "
        f"{'1 HEAD':>7} {'1 page':>8} {'RSS, peak':>12}"
    )
    for row in rows:
        n = int(row["n"])
        requests = row["list"] + row["head"] + row["get"]
        print(
            f"{n:>7} {row['register_s']:>8.2f}s {row['first_open_ms']:>7.1f}ms "
            f"{row['next_median_ms']:>6.1f}/{row['next_max_ms']:>5.1f}ms {row['check_s']:>10.2f}s "
            f"{row['list']:>5.0f} {row['head']:>5.0f} {row['get']:>4.0f} {row['heads_s']:>9.1f}s "
            f"{requests / n:>9.4f} {row['check_s'] / row['heads_s']:>6.3f} "
            f"{row['immutable_first_open_ms']:>6.1f}ms "
            f"{row['one_head_ms']:>5.1f}ms {row['one_page_ms']:>6.1f}ms "
            f"{row['rss_mb']:>5.0f}/{row['peak_mb']:>4.0f}MB"
        )
    print(
        "\nrequests: what the check sent per shard (a HEAD each sends 1.0); time: the check's seconds over a "
        "HEAD each's (extrapolated from --head-sample HEADs); next 32: median/longest open while checking; "
        "hit: the first open under an immutable plan; 1 HEAD, 1 page: one request alone (a page: 1,000 "
        "objects)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
