"""Errors raised inside the daemon, each carrying the HTTP status and code the API answers with.

DaemonError                      root; `status` and `code` are what the single exception handler sends
├── BadRequest           400     malformed URL, unknown checksum algorithm, bad Range
├── NotAllowed           403     the URL is outside the allow-list (after canonicalisation)
├── NotFound             404     the remote object, the lease or the resident shard does not exist
├── DigestMismatch       409     an uploaded shard list's body does not hash to the digest it names
├── PlanTooLarge         413     a plan names more urls than `--max-plan-urls`
├── Invalid              422     a body the daemon parses itself (a plan's) does not match the schema
├── RemoteError          502     the remote failed after retries, refused access, or sent other bytes
│   └── IntegrityError   502     size or checksum of the downloaded bytes do not match
├── ShuttingDown         503     the daemon is stopping; retry against the next daemon
│   └── Cancelled        503     a download or its retry wait was cut short by the shutdown
├── CacheDirMissing      503     the cache directory vanished and could not be recreated yet
└── InsufficientCapacity 507     the shard cannot fit in the cache

NoRoom (not a DaemonError, never answered): a prefetch found no space it may take; it waits for the next
change, and an open that had joined it fetches on demand.

Every code and its status are listed in `shardcache_protocol.ERROR_CODES`, the contract the client reads;
`error_body` is the one place an error answer's bytes are built.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


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


class DigestMismatch(DaemonError):
    status = 409
    code = "digest_mismatch"


class PlanTooLarge(DaemonError):
    status = 413
    code = "plan_too_large"


class Invalid(DaemonError):
    """The body does not match the schema (as FastAPI's own 422, for bodies read off the event loop)."""

    status = 422
    code = "invalid_request"


class RemoteError(DaemonError):
    status = 502
    code = "remote_failed"


class IntegrityError(RemoteError):
    code = "integrity"


class ShuttingDown(DaemonError):
    status = 503
    code = "shutting_down"


class Cancelled(ShuttingDown):
    """The download was cancelled (daemon shutdown)."""


class CacheDirMissing(DaemonError):
    """The cache directory is gone (removed while the daemon ran): the cache's fault, not the remote's."""

    status = 503
    code = "cache_dir_missing"


class InsufficientCapacity(DaemonError):
    status = 507
    code = "insufficient_capacity"


class NoRoom(Exception):
    """A prefetch found no space it may take; it waits for the next change."""


def error_body(code: str, detail: str) -> bytes:
    """The JSON body of every error answer (`shardcache_protocol.ErrorBody`)."""
    return json.dumps({"error": code, "detail": detail}).encode()


def validation_detail(errors: Sequence[Any]) -> str:
    """One line naming the first invalid fields (from pydantic's or FastAPI's `errors()`)."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) + "; see the HTTP API reference in docs/api.md"
