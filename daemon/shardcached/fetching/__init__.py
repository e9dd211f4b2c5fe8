"""Fetching: reading shards from their remotes, one download per shard in flight, and fetching ahead.

The package's face. `Fetcher` reads remote objects through fsspec (filesystems: one per protocol, with our
timeouts and no redirects; retries: backoff and jitter for transient faults) into checked temp files;
`Downloads` runs one fetch per shard in flight, from the remote's info to a published cache file;
`Prefetcher` fetches what the plans need next and what `POST /v1/prefetch` warms."""

from __future__ import annotations

from shardcached.fetching.downloads import Downloads
from shardcached.fetching.fetcher import Fetcher
from shardcached.fetching.prefetch import Prefetcher

__all__ = [
    "Downloads",
    "Fetcher",
    "Prefetcher",
]
