"""The fsspec filesystems remote reads go through: one per protocol, built once, with our timeouts.

Each filesystem hands retries to the fetcher (s3fs and botocore retry nothing themselves) and takes the
daemon's connect and read timeouts. http(s) filesystems never follow a redirect: a 3xx answer raises
`Redirected`, which the fetcher reports as a final error. Building one is blocking (s3fs imports aiobotocore,
botocore reads its config), so `warm_up` does it at start-up, off the first fetch.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import fsspec

from shardcached.keys import is_local

if TYPE_CHECKING:
    import aiohttp  # imported when an http(s) filesystem is first built: it is slow to import

logger = logging.getLogger(__name__)

RESUMABLE = ("s3", "s3a", "gs", "gcs", "file")  # protocols whose reads take byte ranges


def resumable(url: str) -> bool:
    """Whether a download of `url` can continue from a partial file (the remote serves ranges)."""
    return is_local(url) or url.split("://", 1)[0] in RESUMABLE


class Redirected(Exception):
    """An http(s) remote answered 3xx. Not a DaemonError: fsspec's `info` wraps what its requests raise
    in FileNotFoundError, so the fetcher finds this in the exception chain and reports it as one."""

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
        raise Redirected(str(response.url), response.status, location)


class Filesystems:
    """One fsspec filesystem per protocol, created on first use (thread-safe)."""

    def __init__(self, connect_timeout_s: float = 10.0, read_timeout_s: float = 60.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._by_protocol: dict[str, fsspec.AbstractFileSystem] = {}
        self._lock = threading.Lock()

    def resolve(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem serving canonical `url` and the path to pass it."""
        protocol = "file" if is_local(url) else url.split("://", 1)[0]
        with self._lock:
            fs = self._by_protocol.get(protocol)
            if fs is None:
                fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self._options(protocol))
                if hasattr(fs, "retries"):
                    fs.retries = 1  # s3fs retries SlowDown/5xx itself; ours is the one policy
                self._by_protocol[protocol] = fs
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
                fs, _ = self.resolve(prefix)
                connect = getattr(fs, "connect", None)  # s3fs: build the session and client now
                if callable(connect):
                    connect()
            except Exception as exc:  # an unusable protocol is reported by the first real fetch
                logger.debug("warming up the filesystem for %s failed: %s", prefix, exc)

    def _options(self, protocol: str) -> dict[str, Any]:
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
