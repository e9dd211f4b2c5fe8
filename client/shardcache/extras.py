"""Optional dependencies: which extra of `shardcache` brings the package a feature needs.

The client's own imports of torch, pylance and pyarrow name their extra where they happen (`TorchLoader`,
the lance and parquet sources, `.cache()`). Remote filesystems are imported by fsspec, whose message
("Install s3fs to access S3") does not say how to get it with shardcache; `filesystem_extra` adds that. It
wraps the two places the client calls fsspec: every direct read of a shard (`direct.open_direct`,
used by `daemon=None`, an `auto` client without a daemon, and shards too big for the cache) and the
listing of shard globs (`shards`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from shardcache.errors import ConfigError

# fsspec protocol -> the shardcache extra that installs its implementation
EXTRA_OF_PROTOCOL = {"s3": "s3", "s3a": "s3"}


@contextlib.contextmanager
def filesystem_extra(url: str) -> Iterator[None]:
    """Turn fsspec's ImportError for `url`'s protocol into a ConfigError naming the extra to install.

    Example:
        >>> with filesystem_extra("s3://bucket/shard.tar"):  # doctest: +SKIP
        ...     fsspec.open("s3://bucket/shard.tar").open()
    """
    try:
        yield
    except ImportError as exc:
        protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
        extra = EXTRA_OF_PROTOCOL.get(protocol)
        if extra is None:
            raise
        raise ConfigError(
            f"{url}: reading {protocol}:// URLs needs the {extra} extra ({exc}): "
            f"pip install 'shardcache[{extra}]'"
        ) from exc
