"""Start-up recovery: remove what a crash left in the cache directory and find what can be served again.

Temp files of interrupted downloads go; a data or meta file without its partner, or with the wrong size,
goes. Only regular files count: a symlink (or anything else) planted under a shard's name is removed, never
indexed, so the daemon cannot be made to serve a file it did not write. A crash while a stale version was
kept for a lease can leave two versions of one URL; the newest is kept. Partial downloads younger than
`PARTIAL_TTL_S` are kept, unindexed, for a later download of the same version to resume.

A restart of a full cache reads every meta file before the daemon listens (10^6 shards: a minute or more
of CPU), so the loop over the files is lean: files are opened and stat-ed relative to the directory's
descriptor (no path built and resolved per file), and a Path is made only for the entries kept.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from shardcached.storage.layout import (
    META_SUFFIX,
    PART_PREFIX,
    PARTIAL_TTL_S,
    TEMP_PREFIX,
    Entry,
    remove_file,
)

logger = logging.getLogger(__name__)


@dataclass
class Recovered:
    """What `recover_cache_dir` found servable, and the partial downloads it kept."""

    entries: list[Entry] = field(default_factory=list)
    partials: dict[str, tuple[int, float]] = field(default_factory=dict)  # key -> (bytes, mtime)


def recover_cache_dir(cache_dir: Path) -> Recovered:
    """Remove leftovers of a crash from `cache_dir` (created if missing); the shards and partials found."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    names = set(os.listdir(cache_dir))
    found = Recovered()
    data_names: set[str] = set()
    newest: dict[str, tuple[int, Entry]] = {}
    dir_fd = os.open(cache_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in sorted(names):
            _recover_one(cache_dir, dir_fd, name, names, found, data_names, newest)
    finally:
        os.close(dir_fd)
    found.entries = [entry for _, entry in newest.values()]
    for name in names - data_names:
        if name.startswith((TEMP_PREFIX, PART_PREFIX)) or name.endswith(META_SUFFIX):
            continue
        if len(name) >= 64:
            logger.info("removing shard file without metadata: %s", name)
            remove_file(cache_dir / name)
    return found


def _recover_one(
    cache_dir: Path,
    dir_fd: int,
    name: str,
    names: set[str],
    found: Recovered,
    data_names: set[str],
    newest: dict[str, tuple[int, Entry]],
) -> None:
    """Handle one directory entry: a temp file goes, a partial is kept or goes, a meta file is indexed."""
    if name.startswith(TEMP_PREFIX):
        logger.info("removing temp file left by an interrupted download: %s", cache_dir / name)
        remove_file(cache_dir / name)
    elif name.startswith(PART_PREFIX):
        _recover_partial(cache_dir / name, found.partials)
    elif name.endswith(META_SUFFIX):
        loaded = _load_meta(cache_dir, dir_fd, name, names)
        if loaded is None:
            remove_file(cache_dir / name)
            return
        entry, written_ns = loaded
        data_names.add(entry.path.name)
        kept = newest.get(entry.url)
        if kept is not None and kept[0] >= written_ns:
            older: Entry | None = entry
        else:
            newest[entry.url] = (written_ns, entry)
            older = kept[1] if kept is not None else None
        if older is not None:
            logger.info("removing an older version of %s: %s", older.url, older.path.name)
            older.unlink_files()


def _recover_partial(path: Path, partials: dict[str, tuple[int, float]]) -> None:
    try:
        info = path.lstat()
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) or time.time() - info.st_mtime > PARTIAL_TTL_S:
        logger.info("removing partial download %s (too old, or not a regular file)", path)
        remove_file(path)
        return
    key = path.name.removeprefix(PART_PREFIX)
    partials[key] = (info.st_size, info.st_mtime)
    logger.info("keeping partial download %s (%d bytes) to resume", path.name, info.st_size)


def _load_meta(cache_dir: Path, dir_fd: int, meta_name: str, names: set[str]) -> tuple[Entry, int] | None:
    """The entry a meta file describes and the meta's mtime in ns, or None if it is not servable."""
    try:
        key = meta_name.removesuffix(META_SUFFIX)
        # Opened without following a link, then stat-ed through the open file: one lookup, and a symlink
        # planted under a meta file's name fails to open (ELOOP) instead of being read.
        fd = os.open(meta_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            meta_stat = os.fstat(fd)
            if not stat.S_ISREG(meta_stat.st_mode):
                logger.warning(
                    "removing %s: not a regular file (planted in the cache dir?)", cache_dir / meta_name
                )
                return None
            meta = json.loads(_read_all(fd))
        finally:
            os.close(fd)
        data_name = str(meta["file"])
        if data_name not in names or not data_name.startswith(key):
            return None
        data_stat = os.lstat(
            data_name, dir_fd=dir_fd
        )  # never through a link: a planted symlink is not served
        data = cache_dir / data_name
        if not stat.S_ISREG(data_stat.st_mode):
            logger.warning("removing %s: not a regular file (planted in the cache dir?)", data)
            remove_file(data)
            return None
        if data_stat.st_size != int(meta["size"]):
            logger.warning(
                "removing %s: %d bytes on disk, %s expected", data, data_stat.st_size, meta["size"]
            )
            remove_file(data)
            return None
        entry = Entry(
            key=key,
            url=str(meta["url"]),
            version=str(meta["version"]),
            size=int(meta["size"]),
            path=data,
            checksum=meta.get("checksum"),
            last_use=meta_stat.st_mtime,
        )
        return entry, meta_stat.st_mtime_ns
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("removing unreadable shard metadata %s: %s", cache_dir / meta_name, exc)
        return None


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)
