"""`make demo`: two ranks with DataLoader workers train two epochs on an S3 dataset through the node daemon.

Starts moto's S3 server and uploads a generated image-and-label tar dataset (`trainer_demo.data`), starts
`shardcached` with its cache under `.shardcache/` and a capacity smaller than the dataset (75% unless
`--capacity` says otherwise, or the daemon's sizing rule needs more for a tiny dataset), metrics on
127.0.0.1:9464 (or a free port), then runs `--ranks` rank processes (`trainer_demo.rank`) with `--workers`
TorchLoader workers each for `--epochs` epochs. After each epoch the ranks meet the coordinator at a barrier,
where it reads the daemon's counters; at the end it prints hit ratio, bytes fetched against the dataset size,
samples per second and the time spent waiting per epoch, and stops everything.

It stops cleanly on Ctrl-C (status 130), SIGTERM (143), or a rank that reports no progress for
`--stall-timeout` seconds (status 1, naming the rank, since when, and what it was doing): each rank leads a
process group with its DataLoader workers, which the coordinator kills, then it stops the daemon and the S3
endpoint (`trainer_demo.stopping`).

Against your own data: `--shards 's3://bucket/train/shard_{000000..000099}.tar' --no-local-s3` (credentials
and endpoint from the usual AWS environment), and `--socket PATH` to use a daemon that is already running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import DaemonUnavailable, RemoteNotFound, ShardcacheError
from shardcache.formatting import human_bytes
from trainer_demo.coordinator import EXIT_WAIT_S, Coordinator
from trainer_demo.data import DemoDataset, describe_user_shards, upload
from trainer_demo.servers import Daemon, S3Server, free_tcp_port, start_daemon, start_s3_server
from trainer_demo.stopping import Stalled, Terminated, signals_held, signals_raise
from trainer_demo.table import render_table

BUCKET = "shardcache-demo"


def metrics_port(preferred: int) -> int:
    """`preferred` when it is free on 127.0.0.1, else any free port."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As uvicorn binds: a port left in TIME_WAIT by an earlier demo is still usable.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            return free_tcp_port()
    return preferred


def _allow_prefixes(urls: Sequence[str]) -> list[str]:
    return sorted({url.rsplit("/", 1)[0] + "/" for url in urls})


PREFETCH_DEPTH = 2  # the daemon's default --prefetch-depth


def _default_capacity(dataset: DemoDataset, args: argparse.Namespace) -> str:
    """3/4 of the dataset, so the demo shows eviction, but not below the daemon's sizing rule (readers x
    largest shard x (prefetch depth + 1), docs/deploy.md): a smaller cache refuses shards that do not fit
    and the ranks read them directly, which tiny datasets would otherwise show instead of the cache."""
    readers = args.ranks * (max(1, args.workers) + 1)  # training workers, and each rank's validation reader
    shard = dataset.total_bytes // max(1, len(dataset.urls))
    return f"{max(1, dataset.total_bytes * 3 // 4, readers * shard * (PREFETCH_DEPTH + 1))}B"  # bytes


def _prepare(
    args: argparse.Namespace, workdir: Path, stopped: list[str]
) -> tuple[DemoDataset, S3Server | None]:
    if not args.local_s3:
        return describe_user_shards(args.shards, args.val_shards), None
    shard_bytes = int(args.shard_mb * 1024 * 1024)
    print(
        f"starting a local S3 endpoint (moto); uploading {args.shards} training and {args.val_shards} "
        f"validation shards of {human_bytes(shard_bytes)}",
        file=sys.stderr,
    )
    server = start_s3_server(log=workdir / "s3.log")
    try:
        data = upload(server.endpoint, server.env, BUCKET, int(args.shards), args.val_shards, shard_bytes)
    except BaseException:
        with signals_held():
            server.stop()
        stopped.append("stopped the S3 endpoint")
        raise
    os.environ.update(server.env)  # the ranks' direct-read fallback and the daemon find the endpoint here
    return data, server


def run(args: argparse.Namespace, workdir: Path, stopped: list[str]) -> None:
    """Run the demo; on the way out, whatever happened, stop what it started, noting each in `stopped`."""
    data, server = _prepare(args, workdir, stopped)
    daemon: Daemon | None = None
    coordinator: Coordinator | None = None
    cache_dir = Path(args.cache_dir)
    finished = False
    try:
        if args.socket:
            socket, metrics_url = args.socket, args.metrics_url
        else:
            port = metrics_port(args.metrics_port)
            capacity = args.capacity or _default_capacity(data, args)
            number = capacity.removesuffix("B")
            shown = human_bytes(int(number)) if number.isdigit() else capacity
            print(
                f"starting shardcached: cache {cache_dir}/shards, capacity {shown} for a dataset of "
                f"{human_bytes(data.total_bytes)}",
                file=sys.stderr,
            )
            daemon = start_daemon(
                workdir / "shardcache.sock",
                cache_dir / "shards",
                _allow_prefixes(data.urls),
                capacity=capacity,
                env=server.env if server else None,
                metrics_port=port,
                log=workdir / "shardcached.log",
            )
            socket, metrics_url = daemon.socket, daemon.metrics_url
        with DaemonClient(socket, required=True) as client:
            if server is not None:  # a cache left by an earlier demo run would turn the first epoch into hits
                for url in data.urls:
                    with contextlib.suppress(RemoteNotFound):
                        client.evict(url)
                shutil.rmtree(cache_dir / "preprocessed", ignore_errors=True)
            coordinator = Coordinator(args, data, socket, metrics_url)
            coordinator.start()
            rows = coordinator.run(client)
            finished = True
        print()
        print(render_table(rows, data.total_bytes))
        if metrics_url:
            print(f"\nmetrics: {metrics_url} (Prometheus text format; see docs/metrics.md)")
    except BaseException as exc:
        if not isinstance(exc, KeyboardInterrupt | Terminated | Stalled):
            for log in (workdir / "shardcached.log", workdir / "s3.log"):
                if log.exists() and log.stat().st_size:
                    tail = log.read_text(errors="replace").splitlines()[-15:]
                    print(f"--- last lines of {log.name} ---", *tail, sep="\n", file=sys.stderr)
        raise
    finally:
        with signals_held():  # ranks first (they use the daemon), then the daemon, then the S3 endpoint
            if coordinator is not None and (killed := coordinator.stop(finished)):
                stopped.append(killed)
                if finished:
                    print(
                        f"the ranks did not exit {EXIT_WAIT_S:g}s after the last epoch: {killed}",
                        file=sys.stderr,
                    )
            if daemon is not None:
                daemon.stop()
                stopped.append("stopped shardcached")
            if server is not None:
                server.stop()
                stopped.append("stopped the S3 endpoint")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="shardcache demo",
        description="Train ranks with DataLoader workers on an S3 dataset through the daemon.",
    )
    parser.add_argument(
        "--shards",
        default=env.get("SHARDCACHE_DEMO_SHARDS", "24"),
        help="training shards to generate (a number), or your shards (s3://bucket/train/{000000..000099}.tar)",
    )
    parser.add_argument("--val-shards", type=int, default=2, help="validation shards (cached with .cache())")
    parser.add_argument("--shard-mb", type=float, default=float(env.get("SHARDCACHE_DEMO_SHARD_MB", "12")))
    parser.add_argument("--no-local-s3", dest="local_s3", action="store_false", help="do not start moto")
    parser.add_argument("--socket", help="use the shardcached already listening on this socket")
    parser.add_argument("--metrics-url", help="with --socket: that daemon's /metrics URL")
    parser.add_argument("--cache-dir", type=Path, default=Path(".shardcache"))
    parser.add_argument("--capacity", help="the daemon's capacity (default: 75%% of the dataset)")
    parser.add_argument("--metrics-port", type=int, default=9464)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="stop the demo when a rank reports no progress for this long (default 60; at least 120 while "
        "it starts; 0: never); raise it for shards that take longer than that to download",
    )
    # Test hook, hidden from --help: RANK:SAMPLES makes each DataLoader worker of that rank hang for good once
    # it has produced SAMPLES samples (in all epochs), as a worker deadlocked after its fork does
    # (tests/client/test_demo_stop.py).
    parser.add_argument("--test-stall", type=_rank_and_samples, help=argparse.SUPPRESS)
    return parser


def _rank_and_samples(text: str) -> tuple[int, int]:
    rank, _, samples = text.partition(":")
    try:
        return int(rank), int(samples)
    except ValueError:
        raise argparse.ArgumentTypeError(f"RANK:SAMPLES expected, got {text!r}") from None


def _check(args: argparse.Namespace) -> str | None:
    generated = args.shards.isdigit()
    if args.local_s3 and not generated:
        args.local_s3 = False  # a shard pattern means the user's own storage
    if generated and (int(args.shards) < args.ranks * max(1, args.workers) or args.shard_mb <= 0):
        return "--shards must be at least --ranks x --workers and --shard-mb > 0"
    if not args.local_s3 and generated:
        return "--no-local-s3 needs --shards with your shard URLs"
    if args.val_shards and args.val_shards < args.ranks:
        return "--val-shards must be 0 or at least --ranks (one validation shard per rank)"
    if min(args.ranks, args.epochs, args.batch_size) < 1 or args.workers < 0:
        return "--ranks, --epochs and --batch-size must be >= 1, --workers >= 0"
    if args.stall_timeout < 0:
        return "--stall-timeout must be >= 0 (0: never)"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit status (130 after Ctrl-C, 143 after SIGTERM, 1 after a stall)."""
    args = build_parser().parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"shardcache demo: {problem}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="scdemo-", dir="/tmp"))  # short: Unix socket paths are limited
    stopped: list[str] = []
    try:
        with signals_raise():
            run(args, workdir, stopped)
    except (KeyboardInterrupt, Terminated) as exc:
        name, status = ("SIGTERM", exc.exit_status) if isinstance(exc, Terminated) else ("Ctrl-C", 130)
        print(f"\nshardcache demo: interrupted ({name}); {_done(stopped)}", file=sys.stderr)
        return status
    except Stalled as exc:
        print(f"shardcache demo failed: {exc}.\nStopped the demo: {_done(stopped)}", file=sys.stderr)
        return 1
    except DaemonUnavailable as exc:
        print(
            f"shardcache demo failed: no shardcached daemon answers on {exc.socket} ({exc.reason}); start "
            "it, or leave out --socket and the demo starts its own",
            file=sys.stderr,
        )
        return 1
    except (ShardcacheError, RuntimeError, TimeoutError, threading.BrokenBarrierError) as exc:
        print(f"shardcache demo failed: {exc}; {_done(stopped)}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _done(stopped: Sequence[str]) -> str:
    return ", ".join(stopped) if stopped else "nothing was running yet"


if __name__ == "__main__":
    sys.exit(main())
