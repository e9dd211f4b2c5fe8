"""Checksums of resident copies: an open that carries one is served only a copy that matches it.

A shard published without a checksum (a prefetch: plans carry none) or with another one is hashed once, in
a worker thread, and the verified checksum recorded in its metadata, so later opens carrying it are plain
hits. A copy that does not match is evicted; the open then fetches again with the checksum, which either
brings the right bytes or answers 502 `checksum_mismatch`.

A shard version whose download failed an open's checksum is remembered (`refuse`): prefetches and warming,
which carry no checksum, do not publish it again until the object changes on the remote (a new version).
An open without a checksum still gets the remote's bytes; an open with one never gets a copy that fails it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from shardcached.storage.checksums import file_matches, normalize_checksum
from shardcached.storage.layout import Entry
from shardcached.storage.space import Space
from shardcached.storage.store import Store

logger = logging.getLogger(__name__)

Blocking = Callable[..., Awaitable[Any]]  # runs a blocking call in the service's thread pool
MAX_REFUSED = 10_000  # shard versions remembered as failing their checksum, oldest forgotten first


class ChecksumCheck:
    """Verifies resident copies against the checksums opens carry."""

    def __init__(self, store: Store, space: Space, blocking: Blocking) -> None:
        self._store = store
        self._space = space
        self._blocking = blocking
        self._refused: dict[str, str] = {}  # url -> cache key of the version that failed a checksum

    def refuse(self, url: str, key: str) -> None:
        """Remember that the version `key` of `url` failed an open's checksum."""
        self._refused.pop(url, None)
        self._refused[url] = key
        if len(self._refused) > MAX_REFUSED:
            del self._refused[next(iter(self._refused))]

    def refused(self, url: str, key: str) -> bool:
        """Whether the version `key` of `url` failed an open's checksum (not to be prefetched again)."""
        return self._refused.get(url) == key

    async def holds(self, entry: Entry, checksum: str | None) -> bool:
        """Whether a resident shard may be served to an open carrying `checksum` (None: any copy).

        False when the copy was evicted meanwhile (the caller looks again) or does not match (then it is
        evicted with reason `checksum_mismatch`).
        """
        if checksum is None:
            return True
        wanted = normalize_checksum(checksum)
        if entry.checksum == wanted:
            return True
        try:
            matches: bool = await self._blocking(file_matches, entry.path, wanted)
        except FileNotFoundError:
            return False
        store = self._store
        if store.by_url.get(entry.url) is not entry:
            return False
        if matches:
            entry.checksum = wanted
            await self._blocking(store.write_meta, entry)
            return store.by_url.get(entry.url) is entry  # still resident after the awaits
        logger.warning("%s: the cached copy does not match %s; fetching it again", entry.url, wanted)
        self._space.evict(entry.url, "checksum_mismatch")
        return False
