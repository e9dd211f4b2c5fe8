"""Remote reads through fsspec: object info, and chunked downloads to a temp file that are checked.

Everything here is blocking and runs in worker threads: fsspec's sync API is simplest to bound that way.
A download streams the remote object into a temp file with `get_file` (small chunks, so memory does not
grow with shard size), then checks size and checksum. Each call runs under the retry policy (retries.py:
transient errors retried with backoff and jitter, missing objects and refusals reported at once) on the
protocol's filesystem (filesystems.py). A failed download removes its temp file.

Resuming: on remotes that serve byte ranges (`filesystems.RESUMABLE`: S3, GCS, local files) a download
cancelled by a graceful shutdown keeps what it received, fsynced, as the store's partial file; the next
download of the same remote version (the partial's name holds it) continues from there with ranged reads,
then checks the remote version again, the full size and the checksum before the shard is published. A
transient error in the middle of a download resumes the same way. Other remotes (http) always start over.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.callbacks import Callback

from shardcached.errors import Cancelled, IntegrityError
from shardcached.fetching.filesystems import Filesystems, resumable
from shardcached.fetching.retries import RetryPolicy
from shardcached.keys import is_local
from shardcached.storage import parse_checksum

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteInfo:
    """Size and version (ETag, or size and mtime) of a remote object."""

    size: int
    version: str

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> RemoteInfo:
        """From an fsspec `info` dict or an S3 listing entry (`Size`, `ETag`, `LastModified`): the ETag
        without its quotes when there is one, else size and mtime. A listing and a HEAD of one object give
        the same version, so either can validate a copy."""
        size = int(info["size"] if "size" in info else info["Size"])
        etag = info.get("ETag") or info.get("etag")
        if etag:
            return cls(size, str(etag).strip('"'))
        mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or ""
        return cls(size, f"{size}:{mtime}")


class _Watch(Callback):  # type: ignore[misc]  # fsspec is untyped
    """fsspec progress callback that counts bytes, enforces the size and aborts on cancel."""

    def __init__(self, url: str, size: int, cancel: threading.Event, progress: Callable[[int], None]) -> None:
        super().__init__()
        self.url, self.limit, self.cancel, self.progress = url, size, cancel, progress
        self.seen = 0

    def relative_update(self, inc: int = 1) -> None:
        if self.cancel.is_set():
            raise Cancelled(f"download of {self.url} cancelled: the daemon is shutting down")
        self.seen += inc
        self.progress(inc)
        if self.seen > self.limit:
            raise IntegrityError(
                f"{self.url} is larger than the {self.limit} bytes announced: the object changed during the "
                f"download or the manifest is wrong",
                code="size_mismatch",
            )


class Fetcher:
    """Blocking remote reads: object info and checked, resumable downloads, each under the retry policy."""

    def __init__(
        self,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        chunk_bytes: int = 8 * 1024 * 1024,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        on_error: Callable[[str], None] = lambda kind: None,
        on_request: Callable[[str], None] = lambda op: None,
    ) -> None:
        self.chunk_bytes = chunk_bytes
        self.filesystems = Filesystems(connect_timeout_s, read_timeout_s)
        self.retry = RetryPolicy(retries, backoff_s, backoff_max_s, on_error)
        self._on_request = on_request

    def sent(self, url: str, op: str) -> None:
        """Count one request to the remote of `url` (`op`: head, get, list); local files send none."""
        if not is_local(url):
            self._on_request(op)

    def warm_up(self, prefixes: list[str]) -> None:
        """Build the allowed prefixes' filesystems ahead of use (blocking; see `Filesystems.warm_up`)."""
        self.filesystems.warm_up(prefixes)

    def info(self, url: str, cancel: threading.Event | None = None) -> RemoteInfo:
        """Size and version of the object at canonical `url`, with retries."""

        def attempt() -> RemoteInfo:
            fs, path = self.filesystems.resolve(url)
            self.sent(url, "head")
            info = fs.info(path)
            if info.get("type") == "directory":
                raise IsADirectoryError(f"{url} is a directory")
            return RemoteInfo.of(info)

        return self.retry.run(url, attempt, cancel or threading.Event())

    def download(
        self,
        url: str,
        dest: Path,
        size: int,
        checksum: str | None,
        cancel: threading.Event,
        progress: Callable[[int], None],
        *,
        version: str | None = None,
        resume_from: Path | None = None,
        keep_partial: Path | None = None,
    ) -> None:
        """Write the object's `size` bytes to `dest` and fsync it.

        `resume_from`: a partial file of the same remote `version` to continue (moved to `dest`); the
        remote's version is checked again once the bytes are in. `keep_partial`: where a download cancelled
        by shutdown keeps its bytes; on any other failure `dest` is removed.
        """
        algo_digest = parse_checksum(checksum) if checksum else None
        resumed = 0
        if resume_from is not None and resumable(url):
            with contextlib.suppress(FileNotFoundError):
                os.replace(resume_from, dest)
                resumed = dest.stat().st_size
                if resumed > size:
                    os.truncate(dest, 0)
                    resumed = 0
                logger.info("resuming %s at byte %d of %d", url, resumed, size)
        elif resume_from is not None:
            resume_from.unlink(missing_ok=True)
        try:
            self.retry.run(
                url, lambda: self._copy(url, dest, size, algo_digest, cancel, progress), cancel, local=dest
            )
            if resumed and version is not None and self.info(url, cancel).version != version:
                raise IntegrityError(
                    f"{url} changed on the remote while its interrupted download was resumed; open it again "
                    f"to fetch the new version",
                    code="remote_changed",
                )
        except Cancelled:
            if not self._keep(url, dest, keep_partial):
                _remove(dest)
            raise
        except BaseException:
            _remove(dest)
            raise

    def _keep(self, url: str, dest: Path, keep_partial: Path | None) -> bool:
        """Keep a cancelled download's bytes as `keep_partial` when they can be resumed; whether kept."""
        if keep_partial is None or not resumable(url):
            return False
        try:
            received = dest.stat().st_size
            if received == 0:
                return False
            with open(dest, "rb+") as out:
                os.fsync(out.fileno())
            os.replace(dest, keep_partial)
        except OSError as exc:
            logger.warning("could not keep the partial download of %s: %s", url, exc)
            return False
        logger.info("keeping %d bytes of %s in %s to resume after the restart", received, url, keep_partial)
        return True

    def _copy(
        self,
        url: str,
        dest: Path,
        size: int,
        algo_digest: tuple[str, str] | None,
        cancel: threading.Event,
        progress: Callable[[int], None],
    ) -> None:
        fs, path = self.filesystems.resolve(url)
        watch = _Watch(url, size, cancel, progress)
        offset = dest.stat().st_size if resumable(url) and dest.exists() else 0
        self.sent(url, "get")
        if 0 < offset <= size:
            self._copy_from(fs, path, dest, offset, size, watch)
        else:
            self._get_file(fs, url, path, dest, watch, size, progress)
        self._check(url, dest, size, algo_digest)

    def _copy_from(
        self, fs: fsspec.AbstractFileSystem, path: str, dest: Path, offset: int, size: int, watch: _Watch
    ) -> None:
        """Append the remote's bytes from `offset` to `dest`, with ranged reads of `chunk_bytes`."""
        watch.seen = offset  # the size limit counts the bytes already there
        if offset == size:
            return
        with (
            fs.open(path, "rb", block_size=self.chunk_bytes, cache_type="none") as src,
            open(dest, "r+b") as out,
        ):
            src.seek(offset)
            out.seek(offset)
            out.truncate()
            while chunk := src.read(min(self.chunk_bytes, size - offset + 1)):
                out.write(chunk)
                offset += len(chunk)
                watch.relative_update(len(chunk))

    def _get_file(
        self,
        fs: fsspec.AbstractFileSystem,
        url: str,
        path: str,
        dest: Path,
        watch: _Watch,
        size: int,
        progress: Callable[[int], None],
    ) -> None:
        # get_file streams one GET into the file in small chunks (s3fs: 64 KiB, resuming with Range on a
        # broken read), so memory stays flat; one sequential GET also beats many ranged GETs on S3 servers.
        options: dict[str, Any] = {"max_concurrency": 1} if url.startswith(("s3://", "s3a://")) else {}
        if url.startswith(("http://", "https://")):
            options["chunk_size"] = self.chunk_bytes
        fs.get_file(path, str(dest), callback=watch, **options)
        if watch.seen == 0 and size > 0:
            progress(size)  # local copies do not report progress

    def _check(self, url: str, dest: Path, size: int, algo_digest: tuple[str, str] | None) -> None:
        """Size and checksum of the complete file, then fsync: nothing unchecked is ever published."""
        got = dest.stat().st_size
        if got != size:
            raise IntegrityError(
                f"{url}: got {got} bytes, expected {size}; the object changed during the download or the "
                f"manifest size is wrong",
                code="size_mismatch",
            )
        if algo_digest is not None:
            # Hashing reads the fresh file back from the page cache; the hash's CPU cost dominates anyway.
            hasher = hashlib.new(algo_digest[0])
            with open(dest, "rb") as src:
                while chunk := src.read(self.chunk_bytes):
                    hasher.update(chunk)
            if hasher.hexdigest() != algo_digest[1]:
                raise IntegrityError(
                    f"{url}: {algo_digest[0]} checksum {hasher.hexdigest()} does not match the expected "
                    f"{algo_digest[1]}; fix the manifest or re-upload the shard",
                    code="checksum_mismatch",
                )
        with open(dest, "rb+") as out:
            os.fsync(out.fileno())


def _remove(path: Path) -> None:
    """Remove a failed download's temp file; its directory may be gone too (rm -rf of the cache dir)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.debug("could not remove %s: %s", path, exc)
