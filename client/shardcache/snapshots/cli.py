"""`shardcache cache ls | rm`: list and remove `.cache()` entries (no daemon needed).

shardcache cache ls [--cache-dir DIR] [--json]
shardcache cache rm FINGERPRINT|all [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from typing import TypeAlias

from shardcache.errors import ShardcacheError
from shardcache.formatting import human_bytes
from shardcache.snapshots.store import cache_ls, cache_rm, resolve_cache_root

# What `ArgumentParser.add_subparsers()` returns.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M")


def cmd_cache_ls(args: argparse.Namespace) -> int:
    entries = cache_ls(args.cache_dir)
    if args.json:
        print(json.dumps([dataclasses.asdict(entry) for entry in entries], indent=2))
        return 0
    if not entries:
        where = resolve_cache_root(args.cache_dir)
        hint = (
            "" if args.cache_dir else " (give --cache-dir DIR or set $SHARDCACHE_CACHE_DIR to look elsewhere)"
        )
        print(f"no cache entries in {where}{hint}")
        return 0
    rows = [["FINGERPRINT", "STATE", "ROWS", "SIZE", "CREATED", "PIPELINE"]]
    for entry in entries:
        listed = entry.description.get("stages", [])  # a list of strings in a description.json we wrote
        names = [str(stage) for stage in listed] if isinstance(listed, list) else []
        stages = " -> ".join([str(entry.description.get("source", "?")), *names])
        rows.append(
            [
                entry.fingerprint,
                "complete" if entry.complete else "building",
                "-" if entry.rows is None else str(entry.rows),
                human_bytes(entry.size_bytes),
                _when(entry.created),
                stages,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_cache_rm(args: argparse.Namespace) -> int:
    for fingerprint in cache_rm(args.cache_dir, args.which):
        print(f"removed {fingerprint}")
    return 0


def add_cache_subcommands(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add `cache ls` and `cache rm` to a `shardcache` argument parser's subparsers.

    The handlers need no daemon: dispatch with `run_cache_command(args)` when `args.command == "cache"`.
    """
    cache: argparse.ArgumentParser = subparsers.add_parser(
        "cache", help="list or remove .cache() entries (Lance datasets)"
    )
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    ls = actions.add_parser("ls", help="entries with fingerprint, state, rows, size, pipeline")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(run_cache=cmd_cache_ls)
    rm = actions.add_parser("rm", help="remove an entry (fingerprint or unique prefix), or all of them")
    rm.add_argument("which", metavar="FINGERPRINT|all")
    rm.set_defaults(run_cache=cmd_cache_rm)
    for sub in (ls, rm):
        sub.add_argument(
            "--cache-dir", default=None, help="cache root (default: $SHARDCACHE_CACHE_DIR, else ./.cache)"
        )
    return cache


def run_cache_command(args: argparse.Namespace) -> int:
    """Run a parsed `shardcache cache ...` command; 1 and a one-line message on failure."""
    try:
        return int(args.run_cache(args))
    except (ShardcacheError, OSError) as exc:
        print(f"shardcache cache {args.cache_command}: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    """`python -m shardcache.snapshots.cli ls|rm ...` (the same commands without the main CLI)."""
    parser = argparse.ArgumentParser(prog="shardcache")
    add_cache_subcommands(parser.add_subparsers(dest="command", required=True))
    return run_cache_command(parser.parse_args(["cache", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
