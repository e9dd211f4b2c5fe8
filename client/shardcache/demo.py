"""`make demo`: a local S3 endpoint, the daemon, and every shard read twice through `DaemonClient`.

Starts moto's S3 server, uploads a few generated tar shards, starts `shardcached` (cache under
`.shardcache/` in the current directory, socket in a temporary directory, metrics on 127.0.0.1:9464 or a free
port), reads every shard twice, prints hits, misses, bytes fetched against the dataset size and read
throughput, and stops everything, also on Ctrl-C. Sizes come from flags or `SHARDCACHE_DEMO_SHARDS` /
`SHARDCACHE_DEMO_SHARD_MB`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import socket
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from shardcache.cli import human_bytes
from shardcache.daemon_client import DaemonClient
from shardcache.devservers import Daemon, S3Server, free_tcp_port, start_daemon, start_s3_server
from shardcache.errors import RemoteNotFound, ShardcacheError

logger = logging.getLogger(__name__)

BUCKET = "shardcache-demo"
SAMPLE_BYTES = 256 * 1024
READ_CHUNK = 8 * 1024 * 1024


def make_shard(index: int, size: int) -> bytes:
    """A tar shard of about `size` bytes: random `.bin` samples with a small `.json` beside each."""
    samples = max(1, size // SAMPLE_BYTES)
    payload = max(1, size // samples - 1024)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(samples):
            key = f"sample_{index:04d}_{i:05d}"
            for suffix, data in ((".bin", os.urandom(payload)), (".json", b'{"label": %d}' % (i % 10))):
                info = tarfile.TarInfo(key + suffix)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def upload_dataset(server: S3Server, shards: int, shard_bytes: int) -> tuple[list[str], int]:
    """Create the demo bucket and upload generated shards; returns their URLs and total size."""
    try:
        import boto3
    except ImportError as exc:
        raise SystemExit("the demo needs boto3: pip install 'shardcache[dev]' (or run `make demo`)") from exc
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", **_credentials(server))
    s3.create_bucket(Bucket=BUCKET)
    urls, total = [], 0
    for index in range(shards):
        body = make_shard(index, shard_bytes)
        key = f"train/shard_{index:06d}.tar"
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        urls.append(f"s3://{BUCKET}/{key}")
        total += len(body)
    return urls, total


def _credentials(server: S3Server) -> dict[str, str]:
    env = server.env
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
    }


def metrics_port(preferred: int) -> int:
    """`preferred` when it is free on 127.0.0.1, else any free port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return free_tcp_port()
    return preferred


def read_all(client: DaemonClient, urls: Sequence[str]) -> tuple[int, float]:
    """Read every shard to the end; returns (bytes read, seconds)."""
    started = time.perf_counter()
    total = 0
    for url in urls:
        with client.open(url) as shard:
            while chunk := shard.read(READ_CHUNK):
                total += len(chunk)
    return total, time.perf_counter() - started


def _rate(count: int, seconds: float) -> str:
    return f"{human_bytes(count / seconds)}/s" if seconds > 0 else "-"


def run(args: argparse.Namespace, workdir: Path) -> None:
    shard_bytes = int(args.shard_mb * 1024 * 1024)
    print(f"starting a local S3 endpoint (moto); uploading {args.shards} × {human_bytes(shard_bytes)} shards")
    server = start_s3_server(log=workdir / "s3.log")
    daemon: Daemon | None = None
    try:
        urls, dataset_bytes = upload_dataset(server, args.shards, shard_bytes)
        port = metrics_port(args.metrics_port)
        print(f"starting shardcached: cache {args.cache_dir}/, metrics http://127.0.0.1:{port}/metrics")
        daemon = start_daemon(
            workdir / "shardcache.sock",
            args.cache_dir,
            [f"s3://{BUCKET}/"],
            capacity=args.capacity,
            env=server.env,
            metrics_port=port,
            log=workdir / "shardcached.log",
        )
        with DaemonClient(daemon.socket, required=True) as client:
            for url in urls:  # a cache left by an earlier demo run would turn the first pass into hits
                with contextlib.suppress(RemoteNotFound):
                    client.evict(url)
            before = client.stats()
            passes = [read_all(client, urls) for _ in range(2)]
            after = client.stats()
        hits, misses = after.hits - before.hits, after.misses - before.misses
        fetched = after.bytes_fetched - before.bytes_fetched
        print()
        for number, (count, seconds) in enumerate(passes, 1):
            print(f"pass {number}: read {human_bytes(count)} in {seconds:.2f}s ({_rate(count, seconds)})")
        ratio = hits / max(1, hits + misses)
        print(f"opens: {hits + misses}, hits: {hits}, misses: {misses}, hit ratio {ratio:.0%}")
        print(
            f"bytes fetched from S3: {human_bytes(fetched)} for a dataset of {human_bytes(dataset_bytes)} "
            f"({fetched / max(1, dataset_bytes):.2f}x) read twice"
        )
    except BaseException:
        for log in (workdir / "shardcached.log", workdir / "s3.log"):
            if log.exists() and log.stat().st_size and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                tail = log.read_text(errors="replace").splitlines()[-15:]
                print(f"--- last lines of {log.name} ---", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        if daemon is not None:
            daemon.stop()
        server.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardcache demo", description="Read a small S3 dataset twice through the daemon."
    )
    env = os.environ
    parser.add_argument("--shards", type=int, default=int(env.get("SHARDCACHE_DEMO_SHARDS", "8")))
    parser.add_argument("--shard-mb", type=float, default=float(env.get("SHARDCACHE_DEMO_SHARD_MB", "16")))
    parser.add_argument("--cache-dir", type=Path, default=Path(".shardcache"))
    parser.add_argument("--capacity", default="2GiB", help="the daemon's cache capacity")
    parser.add_argument("--metrics-port", type=int, default=9464)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status (130 after Ctrl-C)."""
    args = build_parser().parse_args(argv)
    if args.shards < 1 or args.shard_mb <= 0:
        print("shardcache demo: --shards must be >= 1 and --shard-mb > 0", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="scdemo-", dir="/tmp"))  # short: Unix socket paths are limited
    try:
        run(args, workdir)
    except KeyboardInterrupt:
        print("\ninterrupted; daemon and S3 endpoint stopped", file=sys.stderr)
        return 130
    except (ShardcacheError, RuntimeError, TimeoutError) as exc:
        print(f"shardcache demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
