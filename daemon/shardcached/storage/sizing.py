"""The sizing rule: a cache smaller than readers x largest shard x (prefetch depth + 1) thrashes.

Every reader (a slot of a job with a registered plan) holds the shard it reads and may have up to
`--prefetch-depth` more fetched ahead of it; when all of that cannot be resident at once, prefetched shards
are evicted before they are read and opens wait for space (or get 507). The daemon checks the rule whenever
plans change or a larger shard is fetched, against the largest shard it has seen, and logs a warning once
per larger shortfall.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def required_capacity(readers: int, largest_shard: int, prefetch_depth: int) -> int:
    """Bytes the cache needs so that every reader's current and prefetched shards fit at once."""
    return readers * largest_shard * (prefetch_depth + 1)


class SizingCheck:
    """Warns when the capacity is below `required_capacity` for the readers registered now."""

    def __init__(self, capacity: int, prefetch_depth: int) -> None:
        self.capacity = capacity
        self.prefetch_depth = prefetch_depth
        self.largest_shard = 0
        self._warned_at = 0  # the requirement last warned about; warn again only when it grows

    def saw_shard(self, size: int) -> None:
        self.largest_shard = max(self.largest_shard, size)

    def check(self, readers: int) -> bool:
        """Whether the capacity meets the rule for `readers`; logs a warning the first time it does not."""
        need = required_capacity(readers, self.largest_shard, self.prefetch_depth)
        if need <= self.capacity:
            return True
        if need > self._warned_at:
            self._warned_at = need
            logger.warning(
                "cache capacity %d bytes is below what %d readers need: readers x largest shard (%d bytes) "
                "x (prefetch depth %d + 1) = %d bytes; prefetched shards will be evicted before use and "
                "opens may wait or fail with 507. Raise --capacity, or lower --prefetch-depth",
                self.capacity,
                readers,
                self.largest_shard,
                self.prefetch_depth,
                need,
            )
        return False
