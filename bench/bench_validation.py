"""What checking a beginning job's cached shards against the remote costs (daemon/shardcached/freshness.py),
at 10^3, 10^4 and 10^5 resident shards, against a moto S3 endpoint that counts the requests it serves.

Setup, not timed: moto runs in this process behind a WSGI wrapper that counts requests by kind (list,
head, get); N tiny objects go straight into moto's backend (through its HTTP API 10^5 puts take minutes);
the daemon's cache directory is written directly (each shard's data file and meta, the layout the daemon
recovers at start), so the daemon starts with N resident shards it has never confirmed.

Measured per N, the daemon with `--prefetch-depth 0` (only the checks reach moto):

- a job begins: `POST /v1/plans` with the N urls shuffled, then at once an open of the plan's first shard:
  the registration's answer time, the first open's delay, then the next 32 opens in plan order while the
  check runs (median, longest), the time until every copy is checked (`shardcache_validation_pending_shards`
  at 0 and N validations counted), and the requests moto served meanwhile;
- the first open under an immutable plan of another job (nothing to check): a plain hit's latency;
- baseline, a HEAD each: min(N, --head-sample) HEADs of those objects with the daemon's own `Fetcher.info`
  from 4 threads (the daemon's 4 validation workers) in another process, extrapolated linearly to N.

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
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from harness.daemon_api import api, metric
from harness.devservers import S3_TEST_CREDENTIALS, Daemon, free_tcp_port, start_daemon
from shardcached.keys import cache_key

BUCKET = "bench-validation"
FOLLOWING_OPENS = 32


class CountingEndpoint:
    """moto's S3 in this process, behind a WSGI wrapper that counts the requests it serves by kind."""

    def __init__(self) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        moto_app = DomainDispatcherApplication(create_backend_app)

        def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
            kind = "list" if method == "GET" and "list-type=2" in query else method.lower()
            with self._lock:
                self.counts[kind] += 1
            result: Iterable[bytes] = moto_app(environ, start_response)
            return result

        self.port = free_tcp_port()
        self._server = make_server(
            "127.0.0.1", self.port, counting, threaded=True, request_handler=MotoRequestHandler
        )
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> collections.Counter[str]:
        with self._lock:
            return collections.Counter(self.counts)

    def stop(self) -> None:
        self._server.shutdown()


def put_objects(urls: list[str]) -> dict[str, str]:
    """Tiny objects straight into moto's backend; url -> its ETag (without quotes)."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    if BUCKET not in backend.buckets:
        backend.create_bucket(BUCKET, "us-east-1")
    etags = {}
    for url in urls:
        body = url.encode()
        backend.put_object(BUCKET, url.removeprefix(f"s3://{BUCKET}/"), body)
        etags[url] = hashlib.md5(body).hexdigest()  # noqa: S324 - what S3 (and moto) give as a simple ETag
    return etags


def write_cache(cache_dir: Path, etags: dict[str, str]) -> None:
    """Each shard's data file and meta, as the daemon writes them (layout.py), never confirmed."""
    cache_dir.mkdir(parents=True)
    for url, etag in etags.items():
        key = cache_key(url, etag)
        body = url.encode()
        (cache_dir / f"{key}.tar").write_bytes(body)
        meta = {"url": url, "version": etag, "size": len(body), "checksum": None, "file": f"{key}.tar"}
        (cache_dir / f"{key}.meta.json").write_text(json.dumps(meta))


def open_ms(http: httpx.Client, url: str, plan: str) -> float:
    started = time.perf_counter()
    grant = http.post("/v1/shards/open", json={"url": url, "plan": plan}).raise_for_status().json()
    waited = (time.perf_counter() - started) * 1000
    http.post("/v1/shards/release", json={"lease": grant["lease"]}).raise_for_status()
    return waited


def checked(daemon: Daemon) -> float:
    return sum(
        metric(daemon, "shardcache_validations_total", f'result="{result}"')
        for result in ("unchanged", "changed", "missing")
    )


HEADS = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ThreadPoolExecutor
    from shardcached.fetcher import Fetcher

    urls = sys.stdin.read().split()
    fetcher = Fetcher()
    fetcher.info(urls[0])  # build the S3 client first, as the daemon does at start
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(fetcher.info, urls))
    print(time.perf_counter() - started)
    """
)


def heads_seconds(urls: list[str], env: dict[str, str]) -> float:
    """Seconds for one HEAD of each url, 4 at a time, in another process."""
    done = subprocess.run(
        [sys.executable, "-c", HEADS],
        input="\n".join(urls),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return float(done.stdout.split()[-1])


def measure(n: int, endpoint: CountingEndpoint, root: Path, head_sample: int, seed: int) -> dict[str, float]:
    urls = [f"s3://{BUCKET}/n{n}/shard_{i:07d}.tar" for i in range(n)]
    etags = put_objects(urls)
    cache = root / f"cache-{n}"
    write_cache(cache, etags)
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
            before = endpoint.snapshot()
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
    row["heads_s"] = heads_seconds(sample, {**os.environ, **env}) * n / len(sample)
    row["heads_sampled"] = float(len(sample))
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
        f"{'list':>5} {'head':>5} {'get':>4} {'HEAD each':>10} {'requests':>9} {'time':>6} {'hit':>8}"
    )
    for row in rows:
        n = int(row["n"])
        requests = row["list"] + row["head"] + row["get"]
        print(
            f"{n:>7} {row['register_s']:>8.2f}s {row['first_open_ms']:>7.1f}ms "
            f"{row['next_median_ms']:>6.1f}/{row['next_max_ms']:>5.1f}ms {row['check_s']:>10.2f}s "
            f"{row['list']:>5.0f} {row['head']:>5.0f} {row['get']:>4.0f} {row['heads_s']:>9.1f}s "
            f"{requests / n:>9.4f} {row['check_s'] / row['heads_s']:>6.3f} "
            f"{row['immutable_first_open_ms']:>6.1f}ms"
        )
    print(
        "\nrequests: what the check sent per shard (a HEAD each sends 1.0); time: the check's seconds over a "
        "HEAD each's (extrapolated from --head-sample HEADs); next 32: median/longest open while checking; "
        "hit: the first open under an immutable plan"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
