"""Compressed shards as other tools write them: `.tar.gz`/`.tgz`, `.jsonl.gz`, and with the `zstd` extra
`.tar.zst`/`.jsonl.zst`.

The daemon caches a compressed shard as it is (it never looks inside a shard); readers decompress it here,
whether the shard came through the daemon or directly (`daemon=None`).

Tar shards are decompressed as a stream into the sequential tar reader (`tarfmt.iter_tar_samples_stream`),
not into a buffer for the mmap reader: a compressed tar must be decompressed from its start anyway, the stream
reader needs only one member in memory at a time, and a 2 GB shard decompressed whole would cost each
DataLoader worker that much memory (or a temporary file as large on the cache disk). JSON lines shards are
decompressed whole, because the jsonl source reads a whole file into memory to cut it into line ranges.

Corrupt or truncated compressed data raises `CorruptShardError`, so `on_corrupt="skip"` and
`on_error="skip"` skip it like a truncated plain tar. A 0-byte shard logs a warning and holds no samples.
"""

from __future__ import annotations

import gzip
import io
import logging
import zlib
from collections.abc import Iterator
from types import ModuleType
from typing import IO, TypeVar, cast

from shardcache.errors import ConfigError, CorruptShardError

logger = logging.getLogger(__name__)

T = TypeVar("T")

GZIP, ZSTD = "gzip", "zstd"
# Name endings -> codec, longest first; `.tgz` is a gzip-compressed tar.
_SUFFIXES = ((".tgz", GZIP), (".gz", GZIP), (".zstd", ZSTD), (".zst", ZSTD))


def compression_of(url: str) -> str | None:
    """The codec a shard's name says it is compressed with ("gzip", "zstd"), or None for a plain shard.

    Example:
        >>> compression_of("s3://bucket/train/shard_000000.tar.gz")
        'gzip'
    """
    name = url.split("?", 1)[0].lower()
    for suffix, codec in _SUFFIXES:
        if name.endswith(suffix):
            return codec
    return None


def plain_name(url: str) -> str:
    """The shard's name without its compression suffix: `a.tar.gz` -> `a.tar`, `a.tgz` -> `a.tar`."""
    lower = url.lower()
    if lower.endswith(".tgz"):
        return url[: -len(".tgz")] + ".tar"
    for suffix, _ in _SUFFIXES:
        if lower.endswith(suffix):
            return url[: -len(suffix)]
    return url


def _zstandard(url: str) -> ModuleType:
    try:
        import zstandard
    except ImportError as exc:
        raise ConfigError(
            f"{url}: zstd-compressed shards need the zstandard package: pip install 'shardcache[zstd]'"
        ) from exc
    return zstandard


class CountingReader:
    """A read-only view of a stream that counts the bytes read through it (to notice a 0-byte shard)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True


class DecompressingReader:
    """`read()` of the decompressed bytes of a stream; bad input raises CorruptShardError naming the shard."""

    def __init__(self, source: CountingReader, url: str, codec: str) -> None:
        self.url, self.codec = url, codec
        self.source = source
        self._gzip: gzip.GzipFile | None = None
        self._zstd: _ZstdFrames | None = None
        if codec == GZIP:
            self._gzip = gzip.GzipFile(fileobj=cast(IO[bytes], self.source), mode="rb")
        else:
            self._zstd = _ZstdFrames(self.source, url)

    def read(self, size: int = -1) -> bytes:
        if self._zstd is not None:
            return self._zstd.read(size)
        assert self._gzip is not None
        try:
            return self._gzip.read(size)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise CorruptShardError(self.url, f"invalid or truncated gzip data ({exc})") from exc

    def readable(self) -> bool:
        return True


class _ZstdFrames:
    """Streaming zstd decompression over one or more frames, with a truncated last frame reported.

    zstandard's own `stream_reader` returns end-of-file inside a frame cut short, so a truncated shard would
    read as a shorter valid one; a decompressobj tells (`eof`).
    """

    CHUNK = 1 << 20

    def __init__(self, source: CountingReader, url: str) -> None:
        self.zstandard = _zstandard(url)
        self.source, self.url = source, url
        self._obj = self.zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False  # bytes of the current frame were fed and its end not reached yet
        self._out = bytearray()
        self._done = False

    def read(self, size: int = -1) -> bytes:
        while not self._done and (size < 0 or len(self._out) < size):
            self._feed(self.source.read(self.CHUNK))
        if size < 0:
            size = len(self._out)
        data = bytes(self._out[:size])
        del self._out[:size]
        return data

    def _feed(self, chunk: bytes) -> None:
        if not chunk:
            if self._in_frame:
                raise CorruptShardError(self.url, "truncated zstd data (the last frame is incomplete)")
            self._done = True
            return
        try:
            while chunk:
                self._out += self._obj.decompress(chunk)
                if self._obj.eof:  # a frame ended; what follows is the next frame
                    chunk = self._obj.unused_data
                    self._obj = self.zstandard.ZstdDecompressor().decompressobj()
                    self._in_frame = False
                else:
                    chunk = b""
                    self._in_frame = True
        except self.zstandard.ZstdError as exc:
            raise CorruptShardError(self.url, f"invalid zstd data ({exc})") from exc


def decompressed_stream(raw: IO[bytes], url: str) -> tuple[IO[bytes], CountingReader]:
    """A stream of the shard's plain bytes (decompressed when its name says so), and the counter of the
    bytes read from `raw` (see `warn_if_nothing_read`)."""
    source = CountingReader(raw)
    codec = compression_of(url)
    reader: CountingReader | DecompressingReader = (
        source if codec is None else DecompressingReader(source, url, codec)
    )
    # Both readers have the `read()` the tar stream reader uses.
    return cast(IO[bytes], reader), source


def decompress_all(data: bytes, url: str) -> bytes:
    """The decompressed bytes of a whole compressed shard held in memory (`data` as it is when plain)."""
    codec = compression_of(url)
    if codec is None:
        return data
    if codec == GZIP:
        try:
            return gzip.decompress(data)
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise CorruptShardError(url, f"invalid or truncated gzip data ({exc})") from exc
    return _ZstdFrames(CountingReader(io.BytesIO(data)), url).read()


def warn_empty(url: str) -> None:
    """Log that a shard is 0 bytes long (it yields no samples; it is not treated as corrupt)."""
    logger.warning(
        "shard %s is empty (0 bytes) and holds no samples; re-create it or remove it from the shard list", url
    )


def warn_if_nothing_read(samples: Iterator[T], source: CountingReader, url: str) -> Iterator[T]:
    """`samples`, then a warning when the stream under them turned out to be 0 bytes long."""
    yield from samples
    if source.count == 0:
        warn_empty(url)
