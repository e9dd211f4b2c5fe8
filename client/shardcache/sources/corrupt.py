"""A shard found corrupt through the daemon is reported to it (`POST /v1/shards/revalidate`).

The daemon compares its copy with the remote at once (size, ETag, mtime): when the remote changed (the shard
was fixed there), it drops the copy and the next open fetches the new one, instead of serving the broken
copy until `--revalidate-after-s`. The error then says which of the two happened and what to do.
"""

from __future__ import annotations

import logging

from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import CorruptShardError, DaemonError

logger = logging.getLogger(__name__)

CHANGED = (
    "The shard changed on the remote since the daemon cached it: the daemon dropped its copy and the next "
    "read fetches the new one"
)
SAME = (
    "The daemon's copy is the remote's current version: re-create the shard at the remote (the daemon now "
    "checks the remote on every open of it and fetches it again as soon as it changes there)"
)


def report_corrupt(client: DaemonClient | None, exc: Exception) -> Exception:
    """Tell the daemon that `exc`'s shard is corrupt; the error to raise, with advice from its answer.

    `exc` as it is when it is not a CorruptShardError, when the shard was read without the daemon, or
    when the daemon could not answer (logged at debug level: the error itself is what matters).
    """
    if client is None or not isinstance(exc, CorruptShardError):
        return exc
    try:
        answer = client.revalidate(exc.shard)
    except DaemonError as err:
        logger.debug("could not report corrupt shard %s to the daemon: %s", exc.shard, err)
        return exc
    if not answer.resident:
        return exc  # read directly (no room, no daemon), or already dropped
    return exc.with_advice(CHANGED if answer.changed else SAME)
