"""Reading shards without the daemon, and the message for a shard too big for its cache.

Every direct read goes through `open_direct`: `daemon=None`, an `auto` client while no daemon answers (see
`shardcache.availability`), and a shard the cache cannot hold (`cannot_fit`).
"""

from __future__ import annotations

import contextlib
import logging
import urllib.parse
from typing import IO, BinaryIO, cast

from shardcache.errors import InsufficientCapacity
from shardcache.extras import filesystem_extra

logger = logging.getLogger(__name__)

SIZING_RULE = (
    "size the cache (shardcached --capacity) for at least concurrent readers x largest shard x "
    "(prefetch depth + 1); see 'Sizing the cache' in docs/deploy.md"
)


def cannot_fit(url: str, exc: InsufficientCapacity, *, required: bool, first: bool) -> None:
    """A shard the cache cannot hold (507): say how to size the cache (`required`), or read it directly.

    Returns when the caller is to read the shard directly, after a warning the `first` time (a debug line
    after that).

    Raises:
        InsufficientCapacity: `required`; the message gives the sizing rule.
    """
    if required:
        raise InsufficientCapacity(
            exc.status,
            exc.code,
            (
                f'{exc.detail}. To fix: {SIZING_RULE}, or use daemon="auto" to read shards that do '
                "not fit directly"
            ),
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
    """
    path = local_path_of(url)
    if path is not None:
        return open(path, "rb")
    import fsspec  # a core dependency; the protocol's own package (s3fs, ...) is imported by fsspec

    with filesystem_extra(url):
        handle: IO[bytes] = fsspec.open(url, "rb").open()
    return contextlib.closing(cast(BinaryIO, handle))
