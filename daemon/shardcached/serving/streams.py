"""Leases for streamed reads (`GET /v1/shards/data`): the daemon sends a shard's bytes itself.

Used by clients that cannot open the cached file (another mount namespace, another user). The daemon
streams with its own privileges, so it serves only the regular file it wrote: a file that is no longer
that (say, a symlink planted in the cache dir) is dropped and fetched again rather than served.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from shardcached.errors import DaemonError
from shardcached.storage import Entry

if TYPE_CHECKING:
    from shardcached.service import ShardService

logger = logging.getLogger(__name__)


async def lease_for_stream(service: ShardService, url: str) -> tuple[Entry, str, os.stat_result]:
    """Make the shard local and lease it while its bytes are streamed.

    Returns the entry, the lease and the `lstat` of its file (the response streams that file, opened
    without following links; the lease ends when the response is sent).

    Raises:
        DaemonError: the cache file keeps being replaced by something else (500 `internal`), or any error
            an open answers.
    """
    canonical = service.allow.check(url)
    service.planner.record_open(canonical, None)
    store = service.store
    for _ in range(2):
        entry, result = await service.acquire(canonical, None, None)
        file_stat = store.regular_stat(entry)
        if file_stat is not None:
            lease = store.lease(entry)
            service.note_use(entry, result, None, 0)
            return entry, lease, file_stat
        logger.warning("%s is not the regular file the daemon wrote any more; dropping it", entry.path)
        if store.by_url.get(canonical) is entry:
            service.space.evict(canonical, "invalid")
    raise DaemonError(
        f"the cache file of {canonical} keeps being replaced; check what else writes the cache dir "
        f"{store.cache_dir} (one daemon per cache dir; nothing else may write there)"
    )
