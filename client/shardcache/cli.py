"""`shardcache`: inspect and steer the node daemon from a shell.

    shardcache stats [--json]            counters: hits, misses, bytes, capacity
    shardcache ls [--json]               resident shards: url, size, last use, next use
    shardcache warm URL... [--manifest F] [--background]
    shardcache evict URL
    shardcache manifest PATTERN -o FILE
    shardcache demo [...]

Every command talks to the daemon on `--socket` (default `SHARDCACHE_SOCKET`, then the platform default) and
exits with status 1 and a one-line message when it cannot.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence

from shardcache.daemon_client import DaemonClient
from shardcache.errors import ShardcacheError

logger = logging.getLogger(__name__)

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(count: float) -> str:
    """`1536` -> `'1.5 KiB'`."""
    for unit in _UNITS:
        if abs(count) < 1024 or unit == _UNITS[-1]:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _ago(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    seconds = max(0.0, time.time() - timestamp)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _table(rows: list[list[str]], right: set[int]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def cmd_stats(client: DaemonClient, args: argparse.Namespace) -> int:
    stats = client.stats()
    if args.json:
        print(stats.model_dump_json(indent=2))
        return 0
    share = stats.used / stats.capacity if stats.capacity else 0.0
    rows = [
        ["capacity", human_bytes(stats.capacity)],
        ["used", f"{human_bytes(stats.used)} ({share:.0%})"],
        ["resident shards", str(stats.resident_shards)],
        ["hits", str(stats.hits)],
        ["misses", str(stats.misses)],
        ["hit ratio", f"{stats.hit_ratio:.1%}"],
        ["bytes fetched", human_bytes(stats.bytes_fetched)],
        ["bytes served", human_bytes(stats.bytes_served)],
        ["evictions", str(stats.evictions)],
        ["fetches in flight", str(stats.fetches_in_flight)],
        ["plans", str(stats.plans)],
        ["policy", stats.policy],
    ]
    print(_table(rows, right=set()))
    return 0


def cmd_ls(client: DaemonClient, args: argparse.Namespace) -> int:
    shards = client.shards()
    if args.json:
        print(json.dumps([shard.model_dump() for shard in shards], indent=2))
        return 0
    if not shards:
        print("no resident shards")
        return 0
    rows = [["URL", "SIZE", "LAST USE", "NEXT USE"]]
    for shard in sorted(shards, key=lambda s: s.url):
        next_use = "-" if shard.next_use is None else f"in {shard.next_use:g} opens"
        rows.append([shard.url, human_bytes(shard.size), _ago(shard.last_use), next_use])
    print(_table(rows, right={1}))
    total = sum(shard.size for shard in shards)
    print(f"{len(shards)} shards, {human_bytes(total)}")
    return 0


def cmd_warm(client: DaemonClient, args: argparse.Namespace) -> int:
    targets: list[tuple[str, int | None, str | None]] = [(url, None, None) for url in args.urls]
    if args.manifest:
        from shardcache.shards import read_manifest

        targets += [(ref.url, ref.size, ref.checksum) for ref in read_manifest(args.manifest)]
    if not targets:
        print("shardcache warm: give shard URLs or --manifest FILE", file=sys.stderr)
        return 2
    if args.background:
        client.prefetch([url for url, _, _ in targets])
        print(f"asked the daemon to prefetch {len(targets)} shards", file=sys.stderr)
        return 0
    from tqdm import tqdm

    # Opening each shard (rather than one prefetch request) makes the progress bar and any error real.
    with tqdm(targets, desc="warming", unit="shard", file=sys.stderr, disable=args.quiet) as bar:
        for url, size, checksum in bar:
            # The CLI's client is `required`, so no daemon raises here rather than warming nothing.
            with client.local_path(url, size=size, checksum=checksum):
                pass
    print(f"warmed {len(targets)} shards", file=sys.stderr)
    return 0


def cmd_evict(client: DaemonClient, args: argparse.Namespace) -> int:
    client.evict(args.url)
    print(f"evicted {args.url}", file=sys.stderr)
    return 0


def cmd_manifest(client: DaemonClient, args: argparse.Namespace) -> int:
    from shardcache.shards import write_manifest

    count = write_manifest(args.pattern, args.output)
    print(f"wrote {args.output} with {count} shards", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardcache", description="Inspect and steer the shardcache daemon."
    )
    parser.add_argument(
        "--socket", help="the daemon's Unix socket (default: $SHARDCACHE_SOCKET or the default)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    stats = sub.add_parser("stats", help="the daemon's counters")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.set_defaults(run=cmd_stats)

    ls = sub.add_parser("ls", help="resident shards: url, size, last use, next use")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(run=cmd_ls)

    warm = sub.add_parser("warm", help="fetch shards into the cache now")
    warm.add_argument("urls", nargs="*", metavar="URL", help="shard URLs or paths")
    warm.add_argument("--manifest", help="a .jsonl manifest of shards to warm (from `shardcache manifest`)")
    warm.add_argument("--background", action="store_true", help="ask for a prefetch and return at once")
    warm.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    warm.set_defaults(run=cmd_warm)

    evict = sub.add_parser("evict", help="remove one shard from the cache")
    evict.add_argument("url", metavar="URL")
    evict.set_defaults(run=cmd_evict)

    manifest = sub.add_parser("manifest", help="write a .jsonl manifest (url, size, checksum, samples)")
    manifest.add_argument("pattern", metavar="PATTERN", help="brace range, glob, or path of shards")
    manifest.add_argument("-o", "--output", required=True, help="the manifest file to write")
    manifest.set_defaults(run=cmd_manifest)

    demo = sub.add_parser("demo", help="run the local demo (S3 endpoint, daemon, two passes)", add_help=False)
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)

    from shardcache.cache.cli import add_cache_subcommands

    add_cache_subcommands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardcache` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    if args.command == "demo":
        from shardcache import demo

        return demo.main(args.demo_args)
    if args.command == "cache":
        # `.cache()` entries are local Lance datasets: no daemon is involved.
        from shardcache.cache.cli import run_cache_command

        return run_cache_command(args)
    client = DaemonClient(args.socket, required=True)
    try:
        return int(args.run(client, args))
    except (ShardcacheError, OSError) as exc:
        print(f"shardcache {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
