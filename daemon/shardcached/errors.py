"""Errors raised inside the daemon, each carrying the HTTP status and code the API answers with.

DaemonError                      root; `status` and `code` are what the single exception handler sends
├── BadRequest           400     malformed URL, unknown checksum algorithm, bad Range
├── NotAllowed           403     the URL is outside the allow-list (after canonicalisation)
├── NotFound             404     the remote object, the lease or the resident shard does not exist
├── RemoteError          502     the remote failed after retries, refused access, or sent other bytes
│   └── IntegrityError   502     size or checksum of the downloaded bytes do not match
├── ShuttingDown         503     the daemon is stopping; retry against the next daemon
└── InsufficientCapacity 507     the shard cannot fit in the cache
"""

from __future__ import annotations


class DaemonError(Exception):
    """Root of the daemon's errors; the API maps each to `{"error": code, "detail": message}`."""

    status: int = 500
    code: str = "internal"

    def __init__(self, detail: str, *, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code


class BadRequest(DaemonError):
    status = 400
    code = "bad_request"


class NotAllowed(DaemonError):
    status = 403
    code = "not_allowed"


class NotFound(DaemonError):
    status = 404
    code = "not_found"


class RemoteError(DaemonError):
    status = 502
    code = "remote_failed"


class IntegrityError(RemoteError):
    code = "integrity"


class ShuttingDown(DaemonError):
    status = 503
    code = "shutting_down"


class InsufficientCapacity(DaemonError):
    status = 507
    code = "insufficient_capacity"
