"""Remote reads through fsspec: object info, chunked downloads to a temp file, retries.

Everything here is blocking and runs in worker threads (`asyncio.to_thread`): s3fs and fsspec's sync API
are simplest to bound in memory that way (one chunk per download in flight). A download streams the remote
object in `chunk_bytes` pieces into a temp file, hashing as it goes, so memory does not grow with shard
size. Transient errors are retried with exponential backoff and full jitter; missing objects and refusals
are reported at once. A failed or cancelled download removes its temp file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from shardcached.errors import BadRequest, DaemonError, IntegrityError, NotFound, RemoteError, ShuttingDown
from shardcached.keys import is_local

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class RemoteInfo:
    """Size and version (ETag, or size and mtime) of a remote object."""

    size: int
    version: str


class Cancelled(ShuttingDown):
    """The download was cancelled (daemon shutdown)."""


def parse_checksum(checksum: str) -> tuple[str, str]:
    """`('sha256', 'ab12…')` from `'sha256:ab12…'`.

    Raises:
        BadRequest: not `<algo>:<hex>` or an algorithm hashlib does not know.
    """
    algo, sep, digest = checksum.partition(":")
    algo = algo.lower().replace("-", "")
    if not sep or not digest or algo not in hashlib.algorithms_available:
        raise BadRequest(
            f"invalid checksum {checksum!r}: use '<algorithm>:<hex digest>', e.g. 'sha256:…' "
            f"(algorithms: sha256, sha1, md5, blake2b, ...)",
            code="bad_checksum",
        )
    return algo, digest.lower()


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

    def _fs_options(self, protocol: str) -> dict[str, Any]:
        if protocol in ("s3", "s3a"):
            # Endpoint, region and credentials come from the standard AWS environment and config files,
            # which botocore reads itself (AWS_ENDPOINT_URL_S3, AWS_PROFILE, instance roles).
            # botocore's own retries are turned off so that ours (backoff, jitter, metrics) are the policy.
            config = {
                "connect_timeout": self.connect_timeout_s,
                "read_timeout": self.read_timeout_s,
                "retries": {"max_attempts": 1, "mode": "standard"},
            }
            return {"config_kwargs": config}
        if protocol in ("http", "https"):
            import aiohttp

            timeout = aiohttp.ClientTimeout(
                sock_connect=self.connect_timeout_s, sock_read=self.read_timeout_s
            )
            return {"client_kwargs": {"timeout": timeout}}
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

    def download(
        self,
        url: str,
        dest: Path,
        size: int,
        checksum: str | None,
        cancel: threading.Event,
        progress: Callable[[int], None],
    ) -> None:
        """Write the object's `size` bytes to `dest` and fsync it; `dest` is removed on any failure."""
        algo_digest = parse_checksum(checksum) if checksum else None
        try:
            self._with_retries(
                url, lambda: self._copy(url, dest, size, algo_digest, cancel, progress), cancel
            )
        except BaseException:
            dest.unlink(missing_ok=True)
            raise

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
        hasher = hashlib.new(algo_digest[0]) if algo_digest else None
        total = 0
        # http: a streaming reader (block_size=0) needs no Range support; elsewhere one ranged read per chunk.
        options: dict[str, Any] = {"block_size": 0} if url.startswith("http") else {"cache_type": "none"}
        with fs.open(path, "rb", **options) as src, open(dest, "wb") as out:
            while True:
                if cancel.is_set():
                    raise Cancelled(f"download of {url} cancelled: the daemon is shutting down")
                chunk = src.read(min(self.chunk_bytes, max(size - total, 1)) if total < size else 1)
                if not chunk:
                    break
                total += len(chunk)
                if total > size:
                    raise IntegrityError(
                        f"{url} is larger than the {size} bytes announced: the object changed during the "
                        f"download or the manifest is wrong",
                        code="size_mismatch",
                    )
                out.write(chunk)
                if hasher is not None:
                    hasher.update(chunk)
                progress(len(chunk))
            if total != size:
                raise IntegrityError(
                    f"{url}: got {total} bytes, expected {size}; the object changed during the download or "
                    f"the manifest size is wrong",
                    code="size_mismatch",
                )
            if hasher is not None and algo_digest is not None and hasher.hexdigest() != algo_digest[1]:
                raise IntegrityError(
                    f"{url}: {algo_digest[0]} checksum {hasher.hexdigest()} does not match the expected "
                    f"{algo_digest[1]}; fix the manifest or re-upload the shard",
                    code="checksum_mismatch",
                )
            out.flush()
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
            except FileNotFoundError as exc:
                self._on_error("not_found")
                raise NotFound(f"{url} does not exist: {exc}", code="remote_not_found") from exc
            except IsADirectoryError as exc:
                self._on_error("not_found")
                raise NotFound(f"{url} is a directory, not a shard file", code="remote_not_found") from exc
            except PermissionError as exc:
                self._on_error("forbidden")
                raise RemoteError(
                    f"the remote refused access to {url}: {exc}; check the daemon's credentials",
                    code="remote_forbidden",
                ) from exc
            except Exception as exc:
                status = getattr(exc, "status", None)
                if isinstance(status, int) and 400 <= status < 500 and status != 429:
                    self._on_error("client_error")
                    raise RemoteError(f"the remote answered {status} for {url}: {exc}") from exc
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
