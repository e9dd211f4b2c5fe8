"""Error answers: every error is `{"error": code, "detail": text}`, and each code comes with one status.

The daemon raises errors carrying these codes; the client maps the status back to a typed exception and
keeps the code. A code not listed here is a bug in the daemon.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# What each error status means (the API reference and the OpenAPI schema describe the statuses with these).
STATUS_MEANINGS: dict[int, str] = {
    400: "Malformed URL, checksum, range or body",
    403: "The URL is outside the daemon's allow-list (after canonicalisation)",
    404: "The remote object, lease, plan, session or resident shard does not exist",
    405: "The method is not allowed on this path",
    409: "The shard list's body does not match the digest it is uploaded under",
    413: "The plan names more urls than the daemon's bound (`--max-plan-urls`)",
    422: "The body or query does not match the schema",
    500: "A bug or an unexpected state in the daemon; its log has the traceback",
    502: "The remote failed after retries, refused access, redirected, or sent other bytes",
    503: "The daemon is shutting down; wait for it to come back, then retry",
    507: "The shard cannot fit in the cache (capacity, leases or disk space)",
}

# code -> (status, meaning)
ERROR_CODES: dict[str, tuple[int, str]] = {
    "bad_request": (400, "the request is malformed"),
    "bad_url": (400, "the URL cannot be canonicalised (scheme, characters, relative path)"),
    "bad_checksum": (400, "the checksum is not '<algo>:<hex>' with a supported algorithm"),
    "body_too_large": (400, "the request body exceeds 64 KiB"),
    "http_error": (405, "refused by the HTTP layer, e.g. a method the path does not take (the status says)"),
    "digest_mismatch": (409, "a shard list's body hashes to another sha256 than its name; upload it again"),
    "plan_too_large": (413, "the plan is longer than `shardcached --max-plan-urls`; register shorter plans"),
    "invalid_request": (422, "the body or query does not match the schema"),
    "not_allowed": (403, "the URL is outside the allow-list (`shardcached --allow`)"),
    "not_found": (404, "the path, or the remote object, does not exist"),
    "remote_not_found": (404, "the remote object does not exist"),
    "unknown_lease": (404, "the lease is unknown or expired; open the shard again"),
    "unknown_plan": (404, "the plan is unknown (deleted, or dropped as stale)"),
    "unknown_session": (404, "the session ended (its connection closed, or the daemon restarted); start one"),
    "unknown_shardlist": (404, "the shard list is not known (any more): upload it with PUT, then retry"),
    "not_resident": (404, "the shard is not in the cache"),
    "internal": (500, "a bug or an unexpected state; see the daemon's log"),
    "remote_failed": (502, "the remote failed after the daemon's retries"),
    "remote_forbidden": (502, "the remote refused the daemon's credentials"),
    "remote_redirect": (502, "the remote answered a redirect, which the daemon does not follow"),
    "integrity": (502, "the downloaded bytes do not match what was expected"),
    "size_mismatch": (502, "the remote object's size differs from the size the open gave"),
    "checksum_mismatch": (502, "the downloaded bytes do not match the open's checksum"),
    "remote_changed": (502, "the remote object changed while its download was resumed; open it again"),
    "shutting_down": (503, "the daemon is stopping or restarting; retry once it is back"),
    "cache_dir_missing": (503, "the daemon's cache directory vanished and is not recreated yet"),
    "insufficient_capacity": (507, "the shard is larger than the capacity, or leases pin the space"),
    "cache_disk_full": (507, "the cache filesystem is full of other files, or of leased shards"),
    "cache_pinned": (507, "leased shards alone fill the cache, or this job pins its share; read directly"),
}


def status_of(code: str) -> int:
    """The HTTP status an error code is answered with (500 for a code not in `ERROR_CODES`)."""
    entry = ERROR_CODES.get(code)
    return entry[0] if entry is not None else 500


class ErrorBody(BaseModel):
    """The body of every error answer (unknown fields ignored, like every answer model)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    error: str = Field(description="the error code (see the table of codes)")
    detail: str = Field(description="what went wrong, naming the URL, lease or plan, and what to do")
