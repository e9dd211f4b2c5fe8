"""Remote reads through fsspec: object info, chunked downloads to a temp file, retries.

Everything here is blocking and runs in worker threads: fsspec's sync API is simplest to bound that way.
A download streams the remote object into a temp file with `get_file` (small chunks, so memory does not
grow with shard size), then checks size and checksum. Transient errors are retried with exponential
backoff and full jitter; missing objects and refusals are reported at once. A failed download removes
its temp file.

Resuming: on remotes that serve byte ranges (`RESUMABLE`: S3, GCS, local files) a download cancelled by
a graceful shutdown keeps what it received, fsynced, as the store's partial file; the next download of the
same remote version (the partial's name holds it) continues from there with ranged reads, then checks the
remote version again, the full size and the checksum before the shard is published. A transient error in
the middle of a download resumes the same way. Other remotes (http) always start over.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import fsspec
from fsspec.callbacks import Callback

from shardcached.checksums import parse_checksum
from shardcached.errors import (
    DaemonError,
    InsufficientCapacity,
    IntegrityError,
    NotFound,
    RemoteError,
    ShuttingDown,
)
from shardcached.keys import is_local

if TYPE_CHECKING:
    import aiohttp  # imported when an http(s) filesystem is first built: it is slow to import

logger = logging.getLogger(__name__)

RESUMABLE = ("s3", "s3a", "gs", "gcs", "file")  # protocols whose reads take byte ranges

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


@dataclass(frozen=True)
class RemoteInfo:
    """Size and version (ETag, or size and mtime) of a remote object."""

    size: int
    version: str


class Cancelled(ShuttingDown):
    """The download was cancelled (daemon shutdown)."""


class _Redirected(Exception):
    """An http(s) remote answered 3xx. Not a DaemonError: fsspec's `info` wraps what its requests raise
    in FileNotFoundError, so `_final_error` finds this in the exception chain and reports it as one."""

    def __init__(self, url: str, status: int, location: str) -> None:
        super().__init__(f"{url} answered {status} redirecting to {location!r}")
        self.url, self.status, self.location = url, status, location


async def _refuse_redirects(response: aiohttp.ClientResponse) -> None:
    """aiohttp session hook: a 3xx answer is an error, never followed.

    An allow-listed server could otherwise send the daemon anywhere, e.g. to a cloud metadata endpoint
    (SSRF), since the allow-list checks only the URL we were asked for. `allow_redirects=False` stops
    aiohttp from following; this hook stops fsspec from treating the 3xx's empty body as the object.
    """
    if 300 <= response.status < 400:
        location = response.headers.get("Location", "")
        response.release()
        raise _Redirected(str(response.url), response.status, location)


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
    """Blocking remote access with retries; one fsspec filesystem per protocol."""

    def __init__(
        self,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        chunk_bytes: int = 8 * 1024 * 1024,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        on_error: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.chunk_bytes = chunk_bytes
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._on_error = on_error
        self._filesystems: dict[str, fsspec.AbstractFileSystem] = {}
        self._lock = threading.Lock()

    def _fs(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        protocol = "file" if is_local(url) else url.split("://", 1)[0]
        with self._lock:
            fs = self._filesystems.get(protocol)
            if fs is None:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self._fs_options(protocol))
                if hasattr(fs, "retries"):
                    fs.retries = 1  # s3fs retries SlowDown/5xx itself; ours is the one policy
                self._filesystems[protocol] = fs
        return fs, url if protocol == "file" else fs._strip_protocol(url)

    def warm_up(self, prefixes: list[str]) -> None:
        """Create the filesystems of the allowed prefixes' protocols, and their S3 clients, ahead of use.

        Blocking; the service runs it in a worker thread at start-up. Without it the first S3 fetch paid
        for importing s3fs/aiobotocore/aiohttp (~1 s), creating the botocore session and client (~0.3 s:
        service model, credential chain, endpoint rules) and, doubled on a loaded node, took 1.7-3.2 s for
        a 0.25 s transfer. No request is sent: nothing here touches the remote.
        """
        for prefix in prefixes:
            if is_local(prefix):
                continue
            try:
                fs, _ = self._fs(prefix)
                connect = getattr(fs, "connect", None)  # s3fs: build the session and client now
                if callable(connect):
                    connect()
            except Exception as exc:  # an unusable protocol is reported by the first real fetch
                logger.debug("warming up the filesystem for %s failed: %s", prefix, exc)

    def _fs_options(self, protocol: str) -> dict[str, Any]:
        if protocol in ("s3", "s3a"):
            # Endpoint, region and credentials come from the standard AWS environment and config files,
            # which botocore reads itself (AWS_ENDPOINT_URL_S3, AWS_PROFILE, instance roles).
            # botocore's own retries are turned off so that ours (backoff, jitter, metrics) are the policy.
            # `total_max_attempts` counts attempts; botocore's older `max_attempts` counts RETRIES, so
            # `max_attempts: 1` retried every transient error once, hidden from our metrics.
            config = {
                "connect_timeout": self.connect_timeout_s,
                "read_timeout": self.read_timeout_s,
                "retries": {"total_max_attempts": 1, "mode": "standard"},
            }
            return {"config_kwargs": config}
        if protocol in ("http", "https"):
            import aiohttp

            timeout = aiohttp.ClientTimeout(
                sock_connect=self.connect_timeout_s, sock_read=self.read_timeout_s
            )
            # fsspec passes its storage options (allow_redirects) to every session.get/head it makes.
            client = {"timeout": timeout, "raise_for_status": _refuse_redirects}
            return {"client_kwargs": client, "allow_redirects": False}
        return {}

    def info(self, url: str, cancel: threading.Event | None = None) -> RemoteInfo:
        """Size and version of the object at canonical `url`, with retries."""

        def attempt() -> RemoteInfo:
            fs, path = self._fs(url)
            info = fs.info(path)
            if info.get("type") == "directory":
                raise IsADirectoryError(f"{url} is a directory")
            size = int(info["size"])
            etag = info.get("ETag") or info.get("etag")
            if etag:
                return RemoteInfo(size, str(etag).strip('"'))
            mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or ""
            return RemoteInfo(size, f"{size}:{mtime}")

        return self._with_retries(url, attempt, cancel or threading.Event())

    def resumable(self, url: str) -> bool:
        """Whether a download of `url` can continue from a partial file (the remote serves ranges)."""
        return is_local(url) or url.split("://", 1)[0] in RESUMABLE

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
        if resume_from is not None and self.resumable(url):
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
            self._with_retries(
                url, lambda: self._copy(url, dest, size, algo_digest, cancel, progress), cancel
            )
            if resumed and version is not None and self.info(url, cancel).version != version:
                raise IntegrityError(
                    f"{url} changed on the remote while its interrupted download was resumed; open it again "
                    f"to fetch the new version",
                    code="remote_changed",
                )
        except Cancelled:
            if not self._keep(url, dest, keep_partial):
                dest.unlink(missing_ok=True)
            raise
        except BaseException:
            dest.unlink(missing_ok=True)
            raise

    def _keep(self, url: str, dest: Path, keep_partial: Path | None) -> bool:
        """Keep a cancelled download's bytes as `keep_partial` when they can be resumed; whether kept."""
        if keep_partial is None or not self.resumable(url):
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
        fs, path = self._fs(url)
        watch = _Watch(url, size, cancel, progress)
        offset = dest.stat().st_size if self.resumable(url) and dest.exists() else 0
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

    def _with_retries(self, url: str, attempt: Callable[[], T], cancel: threading.Event) -> T:
        delay = self.backoff_s
        for tries in range(self.retries + 1):
            try:
                return attempt()
            except DaemonError as exc:
                self._on_error(exc.code)
                raise
            except (TypeError, AttributeError, NameError, AssertionError):
                raise  # a bug, not a remote fault: never retried
            except Exception as exc:
                final = self._final_error(url, exc)
                if final is not None:
                    raise final from exc
                self._on_error("transient")
                if tries >= self.retries:
                    raise RemoteError(
                        f"fetching {url} failed after {tries + 1} attempts: {type(exc).__name__}: {exc}"
                    ) from exc
                sleep = random.uniform(0, min(delay, self.backoff_max_s))
                logger.warning("retrying %s in %.2fs after %s: %s", url, sleep, type(exc).__name__, exc)
                delay *= 2
                if cancel.wait(sleep):
                    raise Cancelled(f"fetching {url} cancelled: the daemon is shutting down") from exc
        raise AssertionError("unreachable")

    def _final_error(self, url: str, exc: Exception) -> DaemonError | None:
        """The error to report at once for `exc`, or None when it is transient and worth a retry."""
        kind: str
        error: DaemonError
        redirect = _in_chain(exc, _Redirected)
        if redirect is not None:
            kind = "redirect"
            error = RemoteError(
                f"{redirect}: shardcached does not follow redirects, which could lead it outside the "
                f"allow-list; use the final URL of {url} (and allow-list it) instead",
                code="remote_redirect",
            )
        elif isinstance(exc, FileNotFoundError | IsADirectoryError):
            kind, error = (
                "not_found",
                NotFound(f"{url} does not exist or is not a file: {exc}", code="remote_not_found"),
            )
        elif isinstance(exc, PermissionError):
            kind = "forbidden"
            error = RemoteError(
                f"the remote refused access to {url}: {exc}; check the daemon's credentials",
                code="remote_forbidden",
            )
        elif isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            kind = "disk_full"
            error = InsufficientCapacity(
                f"writing {url} into the cache failed: {exc}; free space on the cache filesystem or set "
                f"shardcached --capacity below what the disk holds",
                code="cache_disk_full",
            )
        elif (
            isinstance(status := getattr(exc, "status", None), int) and 400 <= status < 500 and status != 429
        ):
            kind, error = "client_error", RemoteError(f"the remote answered {status} for {url}: {exc}")
        else:
            return None
        self._on_error(kind)
        return error


def _in_chain(exc: BaseException, kind: type[E]) -> E | None:
    """The first exception of type `kind` in `exc`'s cause/context chain, or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
