"""Reading shards without the daemon, and the message for a shard too big for its cache.

Every direct read goes through `open_direct`: `daemon=None`, an `auto` client while no daemon answers (see
`availability`), a shard the cache cannot hold (`cannot_fit`), and every shard for a while after
the daemon's cache filesystem was found full (`DiskFullMemory`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import IO, BinaryIO, cast

# A core dependency, imported with `shardcache` (about 50 ms more on top of its 0.6-1 s, 2 busy cores) so that
# no forked worker's first direct read imports it (`shardcache.forksafe`, rule 1). The protocol's own
# package (s3fs, ...) is optional: fsspec imports it on the first URL of that protocol (`filesystem_extra`).
import fsspec

from shardcache import forksafe
from shardcache.errors import InsufficientCapacity, RemoteAccessDenied, ShardNotFound
from shardcache.extras import filesystem_extra

logger = logging.getLogger(__name__)

SIZING_RULE = (
    "size the cache (shardcached --capacity) for at least concurrent readers x largest shard x "
    "(prefetch depth + 1); see 'Sizing the cache' in docs/deploy.md"
)


DISK_FULL_CODE = "cache_disk_full"
# How long an `auto` client reads every shard directly, without asking the daemon, after a 507
# `cache_disk_full`. A full cache filesystem is freed by a person or by another job's cleanup, in minutes,
# not from one shard to the next: asking for every shard meanwhile costs a round trip and a remote lookup
# per shard for the same answer. 30 s picks a freed disk up within 30 s, at one refused open per 30 s.
DISK_FULL_RETRY_S = 30.0
DISK_FULL_ADVICE = (
    "free space on the daemon's cache filesystem, or move shardcached --cache-dir to one with room; see "
    "'Cache filesystem full' in docs/troubleshooting.md"
)
PINNED_CODE = "cache_pinned"
# How long an `auto` client reads directly after a 507 `cache_pinned` (open shards fill the cache, or this
# job pins its share, `--max-job-pinned`). Pins end when readers close shards, or within a second of a
# holder's exit, so the cache is asked again soon: one refused open per 5 s instead of a wait per shard.
PINNED_RETRY_S = 5.0
PINNED_ADVICE = (
    "close shards once read (every open shard pins its bytes), check `shardcache stats` for the jobs that "
    "pin the cache, or raise shardcached --capacity or --max-job-pinned; see 'Cache pinned by open shards' "
    "in docs/troubleshooting.md"
)


class DiskFullMemory:
    """Remembers that the daemon's cache filesystem is full (or its cache pinned by open shards, with
    `PINNED_ADVICE`), so shards are read directly for a while.

    After `refused`, `skip_daemon` is True for `retry_s` seconds; then the daemon is asked again. The
    first refusal, and the first after the daemon served an open again (`served`), log one warning; a
    refusal that only confirms the disk is still full logs at debug level.

    Example:
        >>> memory = DiskFullMemory(retry_s=30.0, clock=lambda: 0.0)
        >>> memory.skip_daemon()
        False
    """

    def __init__(
        self,
        retry_s: float = DISK_FULL_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        advice: str = DISK_FULL_ADVICE,
    ) -> None:
        self.retry_s = retry_s
        self.advice = advice
        self._clock = clock
        self._until = float("-inf")  # direct reads without asking until this time
        self._full = False  # in a disk-full episode: warned, not yet served again
        self._lock = threading.Lock()
        forksafe.reset_in_child(self)

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork (`shardcache.forksafe`)

    def skip_daemon(self) -> bool:
        """Whether to read the next shard directly without asking the daemon."""
        return self._full and self._clock() < self._until  # one attribute read while the disk has room

    def refused(self, url: str, exc: InsufficientCapacity) -> None:
        """The daemon answered 507 `cache_disk_full` for `url`: read directly for the next `retry_s`."""
        with self._lock:
            self._until = self._clock() + self.retry_s
            first, self._full = not self._full, True
        if first:
            logger.warning(
                "%s; reading shards directly, without the node cache, and asking the daemon again every "
                "%.0f s until it has room. To fix: %s",
                exc,
                self.retry_s,
                self.advice,
            )
        else:
            logger.debug("the daemon still has no room (%s); reading directly for %.0f s", url, self.retry_s)

    def served(self) -> None:
        """The daemon granted an open: a later disk-full refusal is a new episode, warned about again."""
        if self._full:
            with self._lock:
                self._full = False


def cannot_fit(url: str, exc: InsufficientCapacity, *, required: bool, first: bool) -> None:
    """A shard the cache cannot hold (507): say how to size the cache (`required`), or read it directly.

    Returns when the caller is to read the shard directly, after a warning the `first` time (a debug line
    after that).

    Raises:
        InsufficientCapacity: `required`; the message gives the sizing rule.
    """
    if required:
        advice = DISK_FULL_ADVICE if exc.code == DISK_FULL_CODE else SIZING_RULE
        raise InsufficientCapacity(
            exc.status,
            exc.code,
            f'{exc.detail}. To fix: {advice}, or use daemon="auto" to read shards that do not fit directly',
            url,
        ) from exc
    if first:
        logger.warning(
            "%s; reading it (and any other shard that does not fit) directly, without the node cache. "
            "To cache such shards, %s",
            exc,
            SIZING_RULE,
        )
    else:
        logger.debug("%s; reading it directly", exc)


def local_path_of(url: str) -> str | None:
    """The filesystem path a URL names (plain paths and `file://`), or None for a remote URL."""
    if url.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    if "://" not in url:
        return url
    return None


def open_direct(url: str) -> contextlib.AbstractContextManager[BinaryIO]:
    """Open a shard without the daemon: local paths with `open()`, anything else with fsspec.

    Every direct read goes through here (`daemon=None`, an `auto` client without a daemon, a shard too
    big for the cache), so this is where a missing filesystem package is reported with its extra.

    Raises:
        ConfigError: the URL's filesystem needs a package that is not installed (s3fs for s3://); the
            message names the extra, `pip install 'shardcache[s3]'`.
        ShardNotFound: the shard does not exist (the type the daemon's 404 has, and a FileNotFoundError).
        RemoteAccessDenied: no credentials, or the remote refused them (the type of the daemon's 502).
    """
    path = local_path_of(url)
    try:
        if path is not None:
            return open(path, "rb")
        with filesystem_extra(url):
            handle: IO[bytes] = fsspec.open(url, "rb").open()
    except (FileNotFoundError, IsADirectoryError) as exc:
        raise ShardNotFound(url, str(exc) or type(exc).__name__) from exc
    except Exception as exc:
        if isinstance(exc, PermissionError) or _is_credentials_error(exc):
            raise RemoteAccessDenied(url, f"{type(exc).__name__}: {exc}") from exc
        raise
    return contextlib.closing(cast(BinaryIO, handle))


def _is_credentials_error(exc: BaseException) -> bool:
    """botocore's NoCredentialsError and its kin (PartialCredentialsError, ...), named without importing
    botocore, which is only there with the s3 extra."""
    return any("Credentials" in cls.__name__ for cls in type(exc).__mro__)
