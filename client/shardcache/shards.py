"""Shard lists: paths or URLs, lists, brace ranges, local and remote globs, and `.jsonl` manifests."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import braceexpand
import fsspec
import numpy as np
import numpy.typing as npt

from shardcache.errors import ConfigError
from shardcache.extras import filesystem_extra

logger = logging.getLogger(__name__)

_GLOB = re.compile(r"[*?\[]")
# How many local paths of a shard list are checked to exist when the Dataset is built (`_first_missing`).
_CHECKED = 1024


@dataclass(frozen=True)
class ShardRef:
    """One shard: its URL (or local path) and what a manifest may tell about it."""

    url: str
    size: int | None = None
    checksum: str | None = None
    num_samples: int | None = None
    # Byte offsets of every OFFSET_EVERY-th sample of a plain tar (`tarfmt.sample_index`): a reader that
    # starts inside the shard (equal work per rank) seeks instead of walking the headers before it.
    sample_offsets: tuple[int, ...] | None = None


ShardSpec = str | os.PathLike[str] | ShardRef | Sequence["str | os.PathLike[str] | ShardRef"]


class ShardTuple(tuple[ShardRef, ...]):
    """A source's shards (a tuple), with their URLs also held as one buffer: `urls_blob`.

    What identifies a dataset (its fingerprint, the short description its states carry, its job id) hashes
    every URL. Made from the buffer, that is a hash over bytes that touches none of the n `ShardRef`s: a
    DataLoader worker forked after the buffer was made (`SourceSpec` makes it when it is built) shares the
    pages holding the refs with its parent, where walking them would write their reference counts and copy
    every page (hundreds of MB per worker at 10^6 shards).
    """

    @property
    def urls_blob(self) -> bytes:
        """The URLs one per line (``"\\n".join``), UTF-8; made at the first use and kept."""
        blob: bytes | None = self.__dict__.get("_urls_blob")
        if blob is None:  # (not functools.cached_property: its lock in Python 3.11 is one per class)
            blob = self.__dict__["_urls_blob"] = "\n".join([ref.url for ref in self]).encode()
        return blob

    @property
    def urls_digest(self) -> str:
        """The sha256 of `urls_blob`, in hex: the shard list's name on the daemon (`PUT /v1/shardlists`);
        computed at the first use and kept."""
        digest: str | None = self.__dict__.get("_urls_digest")
        if digest is None:
            digest = self.__dict__["_urls_digest"] = hashlib.sha256(self.urls_blob).hexdigest()
        return digest

    def __reduce__(self) -> tuple[type[ShardTuple], tuple[tuple[ShardRef, ...]]]:
        # Pickled (spawn and forkserver workers) as its refs only: the buffer is made again over there.
        return (ShardTuple, (tuple(self),))


class ListedUrls(Sequence[str]):
    """Urls given as positions in a `ShardTuple`: a plan as the daemon takes it in its compact form (the
    shard list uploaded once, then int32 positions), and a sequence of urls for everything else."""

    __slots__ = ("shards", "positions")

    def __init__(self, shards: ShardTuple, positions: npt.NDArray[np.int32]) -> None:
        self.shards = shards
        self.positions = positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> ListedUrls: ...

    def __getitem__(self, index: int | slice) -> str | ListedUrls:
        if isinstance(index, slice):
            return ListedUrls(self.shards, self.positions[index])
        return self.shards[int(self.positions[index])].url

    def __iter__(self) -> Iterator[str]:
        shards = self.shards
        return (shards[i].url for i in self.positions.tolist())

    def without_repeats(self) -> ListedUrls:
        """The same urls with each run of one position kept once."""
        positions = self.positions
        if len(positions) < 2:
            return self
        keep = np.empty(len(positions), dtype=np.bool_)
        keep[0] = True
        np.not_equal(positions[1:], positions[:-1], out=keep[1:])
        return ListedUrls(self.shards, positions[keep])


def urls_blob(shards: Sequence[ShardRef]) -> bytes:
    """`ShardTuple.urls_blob` of `shards` (made anew for another sequence)."""
    if isinstance(shards, ShardTuple):
        return shards.urls_blob
    return "\n".join([ref.url for ref in shards]).encode()


def has_protocol(url: str) -> bool:
    """Whether `url` names a remote (or explicit) fsspec protocol such as s3:// or file://."""
    return "://" in url


def is_local(url: str) -> bool:
    """Whether `url` is a local path or a file:// URL."""
    return not has_protocol(url) or url.startswith("file://")


def local_path(url: str) -> str:
    """The filesystem path of a local path or file:// URL."""
    return url[len("file://") :] if url.startswith("file://") else url


def _glob(pattern: str) -> list[str]:
    with filesystem_extra(pattern):
        fs, path = fsspec.core.url_to_fs(pattern)
    matches = sorted(fs.glob(path))
    if not has_protocol(pattern):
        return [str(m) for m in matches]
    return [fs.unstrip_protocol(m) for m in matches]


def read_manifest(path: str) -> list[ShardRef]:
    """Read a `.jsonl` manifest of `{"url", "size", "checksum", "num_samples"}` lines.

    Relative URLs are resolved against the manifest's directory.
    """
    refs: list[ShardRef] = []
    base = path.rsplit("/", 1)[0] if "/" in path else "."
    with fsspec.open(path, "rt", encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                url = str(row["url"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"manifest {path} line {number}: expected a JSON object with a 'url' key "
                    f"(write manifests with `shardcache manifest PATTERN -o FILE`)"
                ) from exc
            if not has_protocol(url) and not url.startswith("/"):
                url = f"{base}/{url}"
            offsets = row.get("sample_offsets")
            offsets = tuple(int(o) for o in offsets) if isinstance(offsets, list) else None
            refs.append(ShardRef(url, row.get("size"), row.get("checksum"), row.get("num_samples"), offsets))
    return refs


def _is_manifest(item: str, data_suffix: str | None) -> bool:
    if item.endswith(".manifest.jsonl"):
        return True
    return item.endswith(".jsonl") and data_suffix != ".jsonl"


def _first_missing(urls: Sequence[str]) -> str | None:
    """The first local path of `urls` found not to exist, else None.

    Up to `_CHECKED` paths are all stat-ed. Of a longer list, `_CHECKED` evenly spaced ones are (the first
    and last among them): a wrong folder or brace range still fails here, before anything is planned, while
    10^6 paths cost no 10^6 stats (seconds) at every build. A path missing among the others fails when it is
    read, with `ShardNotFound` naming it (skipped under `on_error="skip"`).
    """
    step = max(1, -(-len(urls) // _CHECKED))
    checked = list(urls[::step])
    if (len(urls) - 1) % step:
        checked.append(urls[-1])
    return next((url for url in checked if not os.path.exists(local_path(url))), None)


def _expanded(text: str) -> Iterable[str]:
    """`braceexpand` of `text`; a text without braces or escapes is itself (a list of 10^6 plain URLs
    would otherwise spend most of its expansion parsing patterns that are not there)."""
    if "{" not in text and "}" not in text and "\\" not in text:
        return (text,)
    return braceexpand.braceexpand(text)  # type: ignore[no-any-return]


def expand_shards(spec: Any, *, data_suffix: str | None = None) -> list[ShardRef]:
    """Expand a shard spec into an ordered list of shards.

    Args:
        spec: A path or URL, a `ShardRef`, or a list of them. Strings may hold brace ranges
            (`shard_{000000..000127}.tar`) and globs (`/data/*.tar`, `s3://bucket/train/*.tar`); a
            `.jsonl` file is read as a manifest unless the source itself reads `.jsonl` data
            (`data_suffix=".jsonl"`), in which case only `*.manifest.jsonl` is a manifest.
        data_suffix: The file suffix the source reads (".tar", ".jsonl", ".parquet"), used only to tell
            manifests from data. Compressed names (`.tar.gz`, `.tgz`, `.jsonl.gz`, `.tar.zst`, `.jsonl.zst`)
            are always data: a manifest is never compressed.

    Returns:
        The shards, in the order given (globs sorted).

    Raises:
        ConfigError: the spec is empty, of the wrong type, or names a local path that does not exist.
    """
    items: Iterable[Any]
    if isinstance(spec, (str, os.PathLike, ShardRef)):
        items = [spec]
    elif isinstance(spec, Sequence):
        items = spec
    else:
        raise ConfigError(
            f"shards={spec!r}: expected a path or URL, a list of them, a brace range, a glob or a manifest"
        )
    refs: list[ShardRef] = []
    local: list[str] = []  # plain local paths, checked for existence together (`_first_missing`)
    for item in items:
        if isinstance(item, ShardRef):
            refs.append(item)
            continue
        if not isinstance(item, (str, os.PathLike)):
            raise ConfigError(f"shards: {item!r} is not a path or URL")
        for text in _expanded(os.fspath(item)):
            if _is_manifest(text, data_suffix):
                refs.extend(read_manifest(text))
            elif _GLOB.search(text):
                matches = _glob(text)
                if not matches:
                    raise ConfigError(f"shards: the glob {text!r} matches no file")
                refs.extend(ShardRef(m) for m in matches)
            else:
                if is_local(text):
                    local.append(text)
                refs.append(ShardRef(text))
    missing = _first_missing(local)
    if missing is not None:
        raise ConfigError(f"shards: {missing} does not exist; check the path or brace range")
    if not refs:
        raise ConfigError(f"shards={spec!r}: no shard given")
    return refs
