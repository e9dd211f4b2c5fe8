"""Daemon memory while it fetches one large object: peak RSS of the shardcached process, sampled.

Starts moto's S3 server, uploads an object of --size-mib MiB with boto3's multipart upload, starts the
daemon, measures its RSS at idle (the baseline), then opens the object through the daemon while a sampler
reads the daemon's RSS every few milliseconds. Target: peak <= 150 MB for a 1 GiB shard, i.e. memory
does not grow with shard size (downloads stream to disk in chunks).

    .venv/bin/python -m bench.bench_daemon_rss                  # 1 GiB
    .venv/bin/python -m bench.bench_daemon_rss --size-mib 256   # quick
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import boto3
import psutil
from boto3.s3.transfer import TransferConfig

from harness.devservers import start_daemon, start_s3_server

MiB = 1024 * 1024


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=3600)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self._path)


def _write_object(path: Path, size: int) -> None:
    block = os.urandom(MiB)  # incompressible; repeated, which S3 does not care about
    with open(path, "wb") as out:
        for _ in range(size // MiB):
            out.write(block)


def _sample_peak(pid: int, stop: threading.Event, interval_s: float) -> list[int]:
    proc = psutil.Process(pid)
    samples = []
    while not stop.is_set():
        samples.append(proc.memory_info().rss)
        stop.wait(interval_s)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    args = parser.parse_args()
    size = args.size_mib * MiB
    work = Path(tempfile.mkdtemp(prefix="sc-rss-", dir="/tmp"))
    s3 = start_s3_server()
    daemon = None
    try:
        os.environ.update(s3.env)
        client = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket="rss")
        blob = work / "object.bin"
        _write_object(blob, size)
        config = TransferConfig(multipart_threshold=64 * MiB, multipart_chunksize=64 * MiB)
        client.upload_file(str(blob), "rss", "big/object.bin", Config=config)
        blob.unlink()
        daemon = start_daemon(
            work / "d.sock",
            work / "cache",
            ["s3://rss"],
            capacity=f"{2 * args.size_mib}MiB",
            env=s3.env,
            log=work / "daemon.log",
        )
        time.sleep(
            1.0
        )  # let start-up allocations settle before the idle baseline (a measurement, not a wait)
        idle = psutil.Process(daemon.process.pid).memory_info().rss
        stop = threading.Event()
        samples: list[int] = []
        sampler = threading.Thread(
            target=lambda: samples.extend(_sample_peak(daemon.process.pid, stop, args.interval_ms / 1000))
        )
        sampler.start()
        started = time.perf_counter()
        conn = _UnixConnection(daemon.socket)
        conn.request("POST", "/v1/shards/open", json.dumps({"url": "s3://rss/big/object.bin"}),
                     {"content-type": "application/json"})  # fmt: skip
        answer = json.loads(conn.getresponse().read())
        elapsed = time.perf_counter() - started
        stop.set()
        sampler.join()
        assert answer["size"] == size, answer
        peak = max(samples)
        print(
            f"object: {args.size_mib} MiB from moto S3 in {elapsed:.1f} s ({size / MiB / elapsed:.0f} MiB/s)"
        )
        print(f"daemon RSS idle:  {idle / 1e6:.1f} MB")
        print(f"daemon RSS peak:  {peak / 1e6:.1f} MB  ({len(samples)} samples; target <= 150 MB)")
        print(
            f"growth over idle: {(peak - idle) / 1e6:.1f} MB  = {(peak - idle) / size:.3f}x the object size"
        )
    finally:
        if daemon is not None:
            daemon.stop()
        s3.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
