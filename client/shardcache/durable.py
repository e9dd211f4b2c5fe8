"""Publishing files on local disk so that a crash never leaves a half-written one visible: flush, then rename.

Shared by the `.cache()` snapshots (`shardcache.snapshots.store`) and the Lance indexes
(`shardcache.sources.lance_store`): both build in a temporary folder, flush it (`fsync_tree`), rename it into
place and flush the parent (`fsync_dir`), so a reader sees a whole entry or none.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it, a new file) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` to disk before it is published."""
    for directory, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` as JSON to `path` via a temporary file, fsync and rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it does not exist or is unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            payload = json.load(f)
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None
