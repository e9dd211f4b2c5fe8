"""Retrying remote calls: which failures are final, and exponential backoff with full jitter for the rest.

Missing objects, refusals, redirects, a full cache disk and other 4xx answers are final: reported at once
as the daemon error that says what to do. Anything else a remote raises is transient and retried; a bug
(TypeError and the like) never is. Every failure is counted by kind through `on_error` (the metrics).
"""

from __future__ import annotations

import errno
import logging
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shardcached.errors import (
    CacheDirMissing,
    Cancelled,
    DaemonError,
    InsufficientCapacity,
    NotFound,
    RemoteError,
)
from shardcached.fetching.filesystems import Redirected

logger = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


class RetryPolicy:
    """Runs a blocking remote call up to `retries + 1` times, sleeping between tries unless cancelled."""

    def __init__(
        self,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        on_error: Callable[[str], None] = lambda kind: None,
    ) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self._on_error = on_error

    def run(
        self, url: str, attempt: Callable[[], T], cancel: threading.Event, local: Path | None = None
    ) -> T:
        """`attempt()`'s result; its final error, or RemoteError once the retries are spent.

        `local`: the cache file the attempt writes. A missing file or directory there is the cache's
        fault, not the remote's: reported as CacheDirMissing and not counted as a fetch error.

        Raises:
            Cancelled: `cancel` was set during a wait between tries.
            CacheDirMissing: the cache directory vanished under the download.
        """
        delay = self.backoff_s
        for tries in range(self.retries + 1):
            try:
                return attempt()
            except Cancelled:
                raise  # the daemon is stopping: not a failure of the remote
            except DaemonError as exc:
                self._on_error(exc.code)
                raise
            except (TypeError, AttributeError, NameError, AssertionError):
                raise  # a bug, not a remote fault: never retried
            except Exception as exc:
                if local is not None and _local_missing(exc, local):
                    raise CacheDirMissing(
                        f"writing {url} into the cache failed: the cache directory {local.parent} is gone "
                        f"({exc}); shardcached recreates it, retry the open"
                    ) from exc
                final = self.final_error(url, exc)
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

    def final_error(self, url: str, exc: Exception) -> DaemonError | None:
        """The error to report at once for `exc`, or None when it is transient and worth a retry."""
        kind: str
        error: DaemonError
        redirect = _in_chain(exc, Redirected)
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


def _local_missing(exc: Exception, local: Path) -> bool:
    """Whether `exc` says the cache file `local` (or its directory) does not exist, not the remote object."""
    missing = _in_chain(exc, FileNotFoundError) or _in_chain(exc, NotADirectoryError)
    if missing is None:
        return False
    return str(local) in (missing.filename, missing.filename2) or not local.parent.is_dir()


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
