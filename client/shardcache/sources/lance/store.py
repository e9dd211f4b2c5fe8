"""Persistent artifacts derived from Lance datasets (filter, reference indexes) under the unified cache root.

The layout is mvp-dataset 0.2.3's (its doc/cache.md), so that a cache directory shared by both reads alike:

```
<cache root>/                         envvars.cache_root(): $SHARDCACHE_CACHE_DIR, $MVP_DATASET_CACHE_DIR
    <source fingerprint>/
        source.json                   what the source is (its logical URIs and versions), for people
        <kind>-v<format>/<artifact fingerprint>/
            manifest.json             parameters, files with their sizes and CRC-32s, the kind's metadata
            complete                  written last: an entry without it is never read
            <files>                   e.g. part-000.i64
    _locks/<...>.lock                 one flock per entry; lock files are never removed
    _tmp/<...>.<pid>.<random>/        builds in progress; removed by the next holder of the entry's lock
```

The source fingerprint names the datasets by their last path component (a local dataset) or their URI (a
remote one), their pinned version and row count, and for a local dataset a hash of that version's manifest
file: two mounts of one shared dataset share entries, and a dataset rewritten under the same name and
version does not. Absolute paths are never part of a fingerprint.

An entry is built under its lock in a private temporary folder and published by one `rename` of that
folder, so a reader sees nothing or the whole entry. A reader checks the marker and every file's size
(`load`), and a kind's reader checks the CRC-32 of what it reads (`read_checked`): an entry that fails is
rebuilt (`ensure`), never served. The rebuild may reuse the files of the broken entry that still check
(`Reusable`), so a truncated part costs one part's scan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict
from urllib.parse import unquote, urlsplit

from shardcache import envvars
from shardcache.durable import FileLock, publish
from shardcache.node import JSONObject, JSONValue

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
COMPLETE = "complete"
_V2_MANIFEST_BASE = (1 << 64) - 1  # Lance's "V2" manifest naming counts down from u64::MAX


def local_path(uri: str) -> Path | None:
    """The local folder of a dataset URI (a plain path or file://), or None for a remote one."""
    parts = urlsplit(uri)
    if not parts.scheme:
        return Path(os.path.abspath(Path(uri).expanduser()))
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(os.path.abspath(unquote(parts.path)))
    return None


def _manifest_digest(root: Path, version: int) -> str | None:
    """sha256 of the dataset's manifest file of `version` (either naming scheme), or None if not found."""
    for name in (f"{version}.manifest", f"{_V2_MANIFEST_BASE - version}.manifest"):
        path = root / "_versions" / name
        if path.is_file():
            return hashlib.sha256(path.read_bytes()).hexdigest()
    return None


def dataset_identity(uri: str, version: int, num_rows: int) -> JSONObject:
    """One dataset as a source fingerprint names it (no absolute path: see the module docstring)."""
    root = local_path(uri)
    identity: JSONObject = {"uri": uri if root is None else root.name, "version": int(version)}
    identity["num_rows"] = int(num_rows)
    if root is not None:
        identity["manifest_sha256"] = _manifest_digest(root, int(version))
    return identity


def digest(payload: object) -> str:
    """A stable 32-hex-digit hash of a JSON-able payload."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Reusable:
    """The files of a broken entry that still check, by name, with the CRC-32 its manifest recorded."""

    folder: Path
    files: Mapping[str, Mapping[str, int]]

    def take(self, name: str, into: Path) -> bool:
        """Link (else copy) file `name` into `into` if it still has its recorded size and CRC-32."""
        path, meta = self.folder / name, self.files.get(name)
        if meta is None or not path.is_file() or path.stat().st_size != meta["size"]:
            return False
        if zlib.crc32(path.read_bytes()) != meta["crc32"]:
            return False
        try:
            os.link(path, into / name)
        except OSError:
            shutil.copy2(path, into / name)
        return True


class FileMeta(TypedDict):
    """What a manifest records of each file of an entry."""

    size: int
    crc32: int


class Manifest(TypedDict):
    """manifest.json of an entry; `metadata` is the kind's own (each kind's reader names its shape)."""

    kind: str
    format_version: int
    source: list[JSONObject]
    parameters: dict[str, JSONValue]
    files: dict[str, FileMeta]
    metadata: Mapping[str, object]


# build(tmp folder, reusable files of a broken entry or None) -> the kind's metadata; it writes files there.
Build = Callable[[Path, Reusable | None], Mapping[str, object]]


@dataclass(frozen=True)
class IndexEntry:
    """One artifact: where it lives and what identifies it."""

    root: Path
    source: Sequence[JSONObject]  # dataset_identity of each dataset, in order
    kind: str  # e.g. "lance-filter-index"
    format_version: int
    parameters: Mapping[str, JSONValue]

    @classmethod
    def under_cache(
        cls, source: Sequence[JSONObject], kind: str, version: int, parameters: Mapping[str, JSONValue]
    ) -> IndexEntry:
        """The entry under the cache root the environment names (read when the index is needed)."""
        return cls(envvars.cache_root(), tuple(source), kind, version, parameters)

    @property
    def source_fingerprint(self) -> str:
        return digest({"kind": "lance", "datasets": list(self.source)})

    @property
    def path(self) -> Path:
        artifact = digest({"kind": self.kind, "format": self.format_version, "parameters": self.parameters})
        return self.root / self.source_fingerprint / f"{self.kind}-v{self.format_version}" / artifact

    @property
    def _label(self) -> str:
        return f"{self.source_fingerprint}-{self.kind}-{self.path.name}"

    def load(self) -> Manifest | None:
        """The manifest of a complete entry whose files all have their recorded sizes, else None."""
        path = self.path
        if not (path / COMPLETE).is_file():
            return None
        try:
            manifest: Manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
            files = manifest["files"]
            for name, meta in files.items():
                if (path / name).stat().st_size != meta["size"]:
                    logger.warning("lance index %s: %s has the wrong size; rebuilding", path, name)
                    return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def read_checked(self, manifest: Manifest, name: str) -> bytes | None:
        """The bytes of file `name` if they match the size and CRC-32 the manifest recorded, else None."""
        meta = manifest["files"].get(name)
        try:
            data = (self.path / name).read_bytes()
        except OSError:
            return None
        if meta is None or len(data) != meta["size"] or zlib.crc32(data) != meta["crc32"]:
            logger.warning("lance index %s: %s does not match its manifest; rebuilding", self.path, name)
            return None
        return data

    def ensure(self, build: Build, *, broken: bool = False) -> Manifest:
        """The manifest of this entry, built (once, whichever process gets the lock first) if needed.

        `broken`: the caller found the published entry bad (`read_checked`); it is rebuilt even if `load`
        still accepts it.
        """
        manifest = None if broken else self.load()
        if manifest is not None:
            return manifest
        # Blocking: a builder that dies drops its flock, so a waiter never waits on a dead process.
        with FileLock(self.root / "_locks" / f"{self._label}.lock").held():
            manifest = self.load()
            # Another process may have built (or rebuilt) it while this one waited.
            if manifest is not None and (not broken or self._all_check(manifest)):
                return manifest
            return self._build(build)

    def _all_check(self, manifest: Manifest) -> bool:
        return all(self.read_checked(manifest, name) is not None for name in manifest["files"])

    def _build(self, build: Build) -> Manifest:
        tmp_root = self.root / "_tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        for stale in tmp_root.glob(f"{self._label}.*"):  # left by a killed build: we hold the lock now
            shutil.rmtree(stale, ignore_errors=True)
        tmp = tmp_root / f"{self._label}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            final = self.path
            reusable = self._reusable(final)
            metadata = build(tmp, reusable)
            files: dict[str, FileMeta] = {}
            for item in sorted(tmp.iterdir()):
                data = item.read_bytes()
                files[item.name] = {"size": len(data), "crc32": zlib.crc32(data)}
            manifest: Manifest = {
                "kind": self.kind,
                "format_version": self.format_version,
                "source": list(self.source),
                "parameters": dict(self.parameters),
                "files": files,
                "metadata": metadata,
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
            (tmp / COMPLETE).write_text("", encoding="utf-8")
            source_json = final.parent.parent / "source.json"
            final.parent.mkdir(parents=True, exist_ok=True)
            if not source_json.is_file():
                source_json.write_text(json.dumps({"kind": "lance", "datasets": list(self.source)}, indent=1))
            # A broken entry there is moved aside first, named so the next holder's cleanup finds it.
            publish(tmp, final, aside=tmp_root / f"{self._label}.trash.{uuid.uuid4().hex[:8]}")
            return manifest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already when published

    @staticmethod
    def _reusable(final: Path) -> Reusable | None:
        try:
            files = json.loads((final / MANIFEST).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return Reusable(final, files) if isinstance(files, dict) else None
