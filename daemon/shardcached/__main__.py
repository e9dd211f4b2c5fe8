"""`shardcached` / `python -m shardcached`: parse flags, build the settings, run the servers."""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from shardcached import __version__

# The daemon's own dependencies come with the `daemon` extra; `pip install shardcache` alone has the client.
_DAEMON_EXTRA_MODULES = ("fastapi", "uvicorn", "uvloop", "pydantic_settings", "prometheus_client")


def require_daemon_extra() -> None:
    """Exit with one line naming the extra when the daemon's dependencies are not installed."""
    import importlib.util

    missing = [name for name in _DAEMON_EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(
            f"shardcached: {', '.join(missing)} not installed; the daemon needs the daemon extra: "
            "pip install 'shardcache[daemon]'"
        )


_EPILOG = """\
Precedence, highest first: flags; SHARDCACHE_* environment variables (SHARDCACHE_CAPACITY, SHARDCACHE_ALLOW
as a JSON list or comma-separated, ...); the TOML files given by --config (keys as the long flags with
underscores: cache_dir, capacity, allow = [...]), the last one given first; the built-in defaults. The
container image passes its defaults file as the first --config, so a config file mounted after it (a
Kubernetes ConfigMap) overrides them. --print-config shows each effective value and where it came from.
S3 endpoint, region and credentials come from the standard AWS environment and config
(AWS_ENDPOINT_URL_S3, AWS_PROFILE, instance roles).

Example:
  shardcached --cache-dir /nvme/shardcache --capacity 90% --allow s3://datasets/train --allow /data
"""


def build_parser() -> argparse.ArgumentParser:
    from shardcached.config import PRODUCTION_CACHE_DIR

    parser = argparse.ArgumentParser(
        prog="shardcached",
        description="Node-local shard cache daemon: keeps whole dataset shards on local disk, fetches them "
        "ahead of use in the order trainers announce, and exports Prometheus metrics.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=argparse.SUPPRESS,  # unset flags must not override env or TOML
    )
    add = parser.add_argument
    add("--version", action="version", version=f"shardcached {__version__}")
    add(
        "--config",
        metavar="FILE",
        action="append",
        help="TOML file with settings, below flags and environment variables; repeatable: a later file "
        "overrides an earlier one",
    )
    add(
        "--print-config",
        action="store_true",
        help="print every effective setting and where it came from (flag, environment variable, file, "
        "default) as a TOML file, then exit",
    )
    add("--cache-dir", metavar="DIR", help=f"where shards are kept (default {PRODUCTION_CACHE_DIR})")
    add(
        "--require-mount",
        metavar="PATH",
        help="refuse to start unless a filesystem is mounted at PATH and the cache directory is on it "
        "(the cache disk's mount point: a missing disk then stops the daemon instead of filling the root "
        "filesystem)",
    )
    add(
        "--capacity",
        metavar="SIZE",
        help="a size with a unit (500GiB, 2TB) or a share of the cache filesystem (90%%); a bare number "
        "counts bytes and must be at least 1 MiB; default 90%%",
    )
    add(
        "--min-free",
        metavar="SIZE",
        help="free space eviction keeps on the cache filesystem whatever the capacity allows: a share of "
        "its size (5%%) or a size (20GiB); 0 turns the floor off; default 5%%",
    )
    add(
        "--socket",
        metavar="PATH",
        help="Unix socket of the API (default /run/shardcache/shardcache.sock "
        "as root, $XDG_RUNTIME_DIR/shardcache.sock otherwise, or $SHARDCACHE_SOCKET)",
    )
    add(
        "--metrics-addr",
        metavar="HOST:PORT",
        help="listener for /metrics and /v1/health (default 127.0.0.1:9464)",
    )
    add(
        "--allow",
        metavar="PREFIX",
        action="append",
        help="URL prefix shards may come from, e.g. "
        "s3://bucket/prefix or /data (repeatable; nothing is allowed by default)",
    )
    add(
        "--immutable",
        metavar="PREFIX",
        action="append",
        help="URL prefix of datasets never rewritten in place (repeatable): their cached copies are never "
        "checked against the remote again",
    )
    add("--prefetch-depth", type=int, metavar="N", help="shards prefetched ahead of each plan (default 2)")
    add("--max-fetches", type=int, metavar="N", help="concurrent downloads (default 4)")
    add("--policy", choices=["belady", "lru"], help="eviction policy (default belady; lru is the baseline)")
    add("--retries", type=int, metavar="N", help="retries of transient remote errors (default 4)")
    add(
        "--retry-backoff-s",
        type=float,
        metavar="S",
        help="first retry backoff, doubled each time with jitter (default 0.2)",
    )
    add("--connect-timeout-s", type=float, metavar="S", help="remote connect timeout (default 10)")
    add("--read-timeout-s", type=float, metavar="S", help="remote read timeout (default 60)")
    add("--lease-ttl-s", type=float, metavar="S", help="lease lifetime if never released (default 300)")
    add(
        "--plan-stale-s", type=float, metavar="S", help="drop plans with no opens for this long (default 600)"
    )
    add(
        "--max-plan-urls",
        type=int,
        metavar="N",
        help="the most urls one plan may name; longer plans get 413 plan_too_large (default 4000000)",
    )
    add(
        "--evict-wait-s",
        type=float,
        metavar="S",
        help="how long an open waits for downloads in flight to give back room before 507 (default 10)",
    )
    add(
        "--max-job-pinned",
        metavar="SIZE",
        help="bytes one job's open shards may pin: a share of the capacity (default 50%%) or a size (100GiB)",
    )
    add(
        "--revalidate-after-s",
        type=float,
        metavar="S",
        help="within a running job, re-check on open the remote version of a cached shard confirmed longer "
        "ago than this; 0 never (default 3600). A job's first reads are checked when it registers its plans",
    )
    add("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `shardcached` console script."""
    require_daemon_extra()
    from shardcached.config import (
        describe_sources,
        gather_layers,
        render_effective,
        settings_from,
        source_of,
    )

    args: dict[str, Any] = vars(build_parser().parse_args(argv))
    config_files = args.pop("config", [])
    print_config = args.pop("print_config", False)
    try:
        layers = gather_layers(args, config_files)
        settings = settings_from(layers)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            source = source_of(str(error["loc"][0]), layers) if error["loc"] else "?"
            message = str(error["msg"]).removeprefix("Value error, ")
            print(f"shardcached: invalid configuration: {where} (from {source}): {message}", file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError) as exc:
        print(f"shardcached: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if print_config:
        print(render_effective(settings, layers), end="")
        return 0
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("shardcached").info("settings: %s", describe_sources(settings, layers))
    import uvloop

    from shardcached.serving import serve

    # A development knob for the benchmarks, not a setting: cProfile the whole daemon, stats dumped at exit.
    profile_path = os.environ.get("SHARDCACHED_PROFILE")
    profiler = cProfile.Profile() if profile_path else None
    try:
        if profiler is not None:
            profiler.enable()
        return uvloop.run(serve(settings))
    except (RuntimeError, OSError, ValueError) as exc:
        logging.getLogger("shardcached").error("%s", exc)
        return 1
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


if __name__ == "__main__":
    sys.exit(main())
