"""`shardcache`: inspect and steer the node daemon from a shell.

    shardcache stats [--json]            counters: hits, misses, bytes, capacity
    shardcache ls [--json]               resident shards: url, size, last use, next use
    shardcache warm SPEC... [--manifest F] [--background]
    shardcache evict URL
    shardcache manifest PATTERN -o FILE
    shardcache cache ls|rm               `.cache()` entries (no daemon)
    shardcache demo [...]                the trainer demo, from a clone of the repository

Every daemon command talks to the daemon on `--socket` (given before or after the command; default
`SHARDCACHE_SOCKET`, then the platform default) and exits with status 1 and a one-line message when it cannot.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import DaemonUnavailable, ShardcacheError
from shardcache.formatting import human_bytes
from shardcache.shards import ShardRef, expand_shards, read_manifest
from shardcache.snapshots.cli import add_cache_subcommands, run_cache_command
from shardcache.sources.manifests import write_manifest

logger = logging.getLogger(__name__)


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


def cmd_job_stats(client: DaemonClient, args: argparse.Namespace) -> int:
    """`stats --job JOB`: what the job's trainers reported, with the split of their workers' time."""
    summary = client.telemetry(args.job)
    if args.json:
        print(summary.model_dump_json(indent=2))
        return 0 if summary.jobs else 1
    if not summary.jobs:
        print(f"no telemetry from job {args.job!r} (the daemon keeps the most recent jobs)", file=sys.stderr)
        return 1
    job = summary.jobs[0]
    per_sample = job.wait_seconds / job.samples * 1e3 if job.samples else 0.0
    print(
        f"job {job.job}: {job.slots} slot(s), {job.samples} samples, trainer waited {job.wait_seconds:.1f} s "
        f"({per_sample:.2f} ms per sample)"
    )
    busy = sum(job.stage_seconds.values())
    if busy <= 0:
        print("no stage times reported (a client older than stage times, or SHARDCACHE_STAGE_TIMES=0)")
        return 0
    rows = [["PART", "SECONDS", "SHARE"]]
    rows += [[name, f"{s:.1f}", f"{s / busy:.0%}"] for name, s in job.stage_seconds.items()]
    print()
    print(_table(rows, right={1, 2}))
    return 0


def cmd_stats(client: DaemonClient, args: argparse.Namespace) -> int:
    if args.job is not None:
        return cmd_job_stats(client, args)
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
        ["pinned", f"{human_bytes(stats.pinned_bytes)} by {stats.leases} leases"],
        ["waits for room", str(stats.room_waits)],
        ["refused: pinned", str(stats.pinned_refusals)],
        ["leases of exited", str(stats.leases_of_exited)],
    ]
    print(_table(rows, right=set()))
    if stats.jobs:
        # Who holds the cache: a job that pins much while others are refused leaks open shards.
        jobs = [["JOB", "LEASES", "PINNED"]]
        jobs += [[job.job, str(job.leases), human_bytes(job.pinned_bytes)] for job in stats.jobs]
        print()
        print(_table(jobs, right={1, 2}))
    return 0


def cmd_ls(client: DaemonClient, args: argparse.Namespace) -> int:
    shards = client.shards()
    if args.json:
        print(json.dumps([shard.model_dump() for shard in shards], indent=2))
        return 0
    if not shards:
        print("no resident shards")
        return 0
    rows = [["URL", "SIZE", "LAST USE", "NEXT USE", "LEASES"]]
    for shard in sorted(shards, key=lambda s: s.url):
        next_use = "-" if shard.next_use is None else f"in {shard.next_use:g} opens"
        rows.append([shard.url, human_bytes(shard.size), _ago(shard.last_use), next_use, str(shard.leases)])
    print(_table(rows, right={1, 4}))
    total = sum(shard.size for shard in shards)
    pinned = [shard for shard in shards if shard.leases]
    print(
        f"{len(shards)} shards, {human_bytes(total)}; {len(pinned)} pinned by open shards "
        f"({human_bytes(sum(shard.size for shard in pinned))})"
    )
    return 0


def cmd_warm(client: DaemonClient, args: argparse.Namespace) -> int:
    refs: list[ShardRef] = []
    if args.urls:
        # The shard specs `from_source` takes. A positional `.jsonl` is a data shard unless it is named
        # `*.manifest.jsonl`: any other manifest name goes through --manifest.
        refs += expand_shards(args.urls, data_suffix=".jsonl")
    if args.manifest:
        refs += read_manifest(args.manifest)
    if not refs:
        print("shardcache warm: give shard URLs or --manifest FILE", file=sys.stderr)
        return 2
    targets = [(ref.url, ref.size, ref.checksum) for ref in refs]
    if args.background:
        client.prefetch([url for url, _, _ in targets])
        print(f"asked the daemon to prefetch {len(targets)} shards", file=sys.stderr)
        return 0
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
    count = write_manifest(args.pattern, args.output)
    print(f"wrote {args.output} with {count} shards", file=sys.stderr)
    return 0


_SOCKET_HELP = "the daemon's Unix socket (default: $SHARDCACHE_SOCKET, else the platform default)"


def find_trainer_demo() -> Path | None:
    """The `examples/` folder of the repository this package was installed from (editable), else None."""
    examples = Path(__file__).resolve().parents[2] / "examples"
    return examples if (examples / "trainer_demo" / "run.py").is_file() else None


def run_demo(demo_args: Sequence[str]) -> int:
    """Run the trainer demo, which lives beside the package in the source repository, with `demo_args`."""
    examples = find_trainer_demo()
    if examples is None:
        print(
            "shardcache demo: the demo ships with the source repository, not with the package: "
            "clone the repository and run `make demo` there",
            file=sys.stderr,
        )
        return 2
    # Spawned rank processes inherit sys.path, so they import the demo's modules from here too.
    sys.path.insert(0, str(examples))
    from trainer_demo.run import main as demo_main

    return int(demo_main(demo_args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardcache", description="Inspect and steer the shardcache daemon."
    )
    parser.add_argument("--socket", help=_SOCKET_HELP)
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    # `--socket` after the command too (`shardcache stats --socket PATH`); SUPPRESS keeps a value given
    # before the command when none is given after it.
    daemon_flags = argparse.ArgumentParser(add_help=False)
    daemon_flags.add_argument("--socket", default=argparse.SUPPRESS, help=_SOCKET_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = sub.add_parser(name, help=help_text, parents=[daemon_flags])
        return made

    stats = command("stats", "the daemon's counters")
    stats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    stats.add_argument(
        "--job", help="a training job's reported figures instead: samples, wait, time per pipeline part"
    )
    stats.set_defaults(run=cmd_stats)

    ls = command("ls", "resident shards: url, size, last use, next use")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(run=cmd_ls)

    warm = command("warm", "fetch shards into the cache now")
    warm.add_argument(
        "urls",
        nargs="*",
        metavar="SPEC",
        help="shard URLs or paths, brace ranges (shard_{0000..0099}.tar), globs, *.manifest.jsonl",
    )
    warm.add_argument("--manifest", help="a .jsonl manifest of shards to warm (from `shardcache manifest`)")
    warm.add_argument("--background", action="store_true", help="ask for a prefetch and return at once")
    warm.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    warm.set_defaults(run=cmd_warm)

    evict = command("evict", "remove one shard from the cache")
    evict.add_argument("url", metavar="URL")
    evict.set_defaults(run=cmd_evict)

    manifest = command("manifest", "write a .jsonl manifest (url, size, checksum, samples)")
    manifest.add_argument("pattern", metavar="PATTERN", help="brace range, glob, or path of shards")
    manifest.add_argument("-o", "--output", required=True, help="the manifest file to write")
    manifest.set_defaults(run=cmd_manifest)

    demo = sub.add_parser(
        "demo",
        help="the trainer demo (local S3, daemon, ranks); from a clone of the repository",
        add_help=False,  # `shardcache demo --help` is the demo's own help
    )
    demo.add_argument("demo_args", nargs=argparse.REMAINDER)

    add_cache_subcommands(sub)
    return parser


def _demo_split(argv: Sequence[str]) -> int | None:
    """The index after the `demo` command in `argv`, None when the command is another one."""
    for index, token in enumerate(argv):
        if token == "demo" and (index == 0 or argv[index - 1] != "--socket"):
            return index + 1
        if not token.startswith("-") and (index == 0 or argv[index - 1] != "--socket"):
            return None  # another command
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardcache` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    split = _demo_split(argv)
    if split is not None:
        # Everything after `demo` is the demo's (argparse's REMAINDER drops a leading `--flag`).
        args = parser.parse_args(argv[:split])
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
        demo_args = argv[split:]
        if args.socket and "--socket" not in demo_args:  # `shardcache --socket PATH demo`: the demo's flag
            demo_args = ["--socket", args.socket, *demo_args]
        return run_demo(demo_args)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    if args.command == "cache":
        # `.cache()` entries are local Lance datasets: no daemon is involved.
        return run_cache_command(args)
    # An operator's command fails at once when no daemon answers, instead of waiting out a restart.
    client = DaemonClient(args.socket, required=True, restart_wait_s=0)
    try:
        return int(args.run(client, args))
    except DaemonUnavailable as exc:
        # The socket and the reason, with this tool's advice (the exception's own is for Python callers).
        advice = client.discovery.join_advice() or (
            "Start shardcached, or give its socket with --socket PATH or the SHARDCACHE_SOCKET environment "
            "variable."
        )
        print(
            f"shardcache {args.command}: no shardcached daemon answers on {exc.socket} ({exc.reason}). "
            f"{advice}",
            file=sys.stderr,
        )
        return 1
    except (ShardcacheError, OSError) as exc:
        print(f"shardcache {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
