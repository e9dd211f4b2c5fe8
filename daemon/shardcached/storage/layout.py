"""The cache directory's files: a resident shard's entry, the names of its files, and safe removal.

Layout: `<key><suffix>` holds a shard's bytes and `<key>.meta.json` its URL, version, size and checksum.
Downloads write `TEMP_PREFIX` files in the same directory; a download cut by a graceful shutdown leaves
`PART_PREFIX<key>`, kept `PARTIAL_TTL_S`. The store (store.py) indexes entries; recovery (recovery.py)
rebuilds that index from these files at start-up.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
PART_PREFIX = ".part-"
META_SUFFIX = ".meta.json"
PARTIAL_TTL_S = 3600.0  # a partial download nobody resumed within this long is removed
# The validation time of a copy the remote has not confirmed since this daemon started (a recovered one):
# older than any bound, so the first open or plan that cares checks it.
NEVER_VALIDATED = -math.inf


@dataclass(eq=False)
class Entry:
    """One resident shard."""

    key: str
    url: str
    version: str
    size: int
    path: Path
    checksum: str | None = None
    last_use: float = field(default_factory=time.time)
    # When the remote last confirmed this version (the service's monotonic clock, at the request's start).
    validated_at: float = NEVER_VALIDATED
    leases: int = 0
    prefetched: bool = False
    used: bool = False
    doomed: bool = False  # evicted, its files kept until its last lease ends
    no_revival: bool = False  # evicted by hand while kept: the next open fetches it again
    suspect: bool = False  # a client found it corrupt: every open checks the remote version (service)

    @property
    def meta_path(self) -> Path:
        return self.path.with_name(self.key + META_SUFFIX)

    def meta_record(self) -> dict[str, object]:
        """What `<key>.meta.json` holds: all recovery needs to index the shard again (recovery.py)."""
        return {
            "url": self.url,
            "version": self.version,
            "size": self.size,
            "checksum": self.checksum,
            "file": self.path.name,
        }

    def unlink_files(self) -> None:
        """Remove the shard's meta and data files (those already gone are skipped)."""
        # Meta first: a crash between the two leaves a data file without meta, which recovery removes.
        self.meta_path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def remove_file(path: Path) -> None:
    """Unlink a file or a link (never what it points to); a directory planted there is left, logged."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        logger.warning("leaving directory %s in the cache dir: remove it by hand", path)
    except OSError as exc:
        logger.warning("could not remove %s: %s", path, exc)
