"""shardcache_protocol: the wire contract of shardcached's HTTP API v1, shared by the daemon and the client.

The daemon (`shardcached`) and the trainer-side client (`shardcache`) both import this package and nothing
else of each other. It holds what the two programs agree on: the pydantic models of every request and
answer, the error codes with the HTTP status each comes with, and the socket path rule. It depends on
pydantic only; importing it loads neither the client's pipeline nor the daemon's server.

    >>> from shardcache_protocol import OpenRequest, status_of
    >>> OpenRequest(url="s3://bucket/train/shard-000001.tar").url
    's3://bucket/train/shard-000001.tar'
    >>> status_of("unknown_lease")
    404
"""

from __future__ import annotations

from shardcache_protocol.errors import ERROR_CODES, STATUS_MEANINGS, ErrorBody, status_of
from shardcache_protocol.models import (
    API_PREFIX,
    MAX_PLAN_URLS,
    MAX_REPORT_STAGES,
    MAX_URL_LENGTH,
    SESSIONS_PATH,
    SHARDLIST_DIGEST,
    URL_PATTERN,
    Health,
    JobPins,
    JobTelemetry,
    OpenGrant,
    OpenRequest,
    OpenResponse,
    PlanRequest,
    PlanResponse,
    PrefetchAccepted,
    PrefetchRequest,
    ReleaseRequest,
    Revalidated,
    SessionGrant,
    SessionRequest,
    ShardInfo,
    ShardList,
    ShardListAccepted,
    ShardUrl,
    Stats,
    TelemetryReport,
    TelemetrySummary,
)
from shardcache_protocol.sockets import (
    DEFAULT_METRICS_ADDR,
    ROOT_SOCKET_PATH,
    SOCKET_ENV,
    SOCKET_NAME,
    default_socket_path,
)

__all__ = [
    "API_PREFIX",
    "DEFAULT_METRICS_ADDR",
    "ERROR_CODES",
    "MAX_PLAN_URLS",
    "MAX_REPORT_STAGES",
    "MAX_URL_LENGTH",
    "ROOT_SOCKET_PATH",
    "SHARDLIST_DIGEST",
    "SOCKET_ENV",
    "SESSIONS_PATH",
    "SOCKET_NAME",
    "STATUS_MEANINGS",
    "URL_PATTERN",
    "ErrorBody",
    "Health",
    "OpenGrant",
    "OpenRequest",
    "OpenResponse",
    "PlanRequest",
    "PlanResponse",
    "PrefetchAccepted",
    "PrefetchRequest",
    "ReleaseRequest",
    "Revalidated",
    "SessionGrant",
    "SessionRequest",
    "ShardInfo",
    "ShardList",
    "ShardListAccepted",
    "ShardUrl",
    "JobPins",
    "JobTelemetry",
    "Stats",
    "TelemetryReport",
    "TelemetrySummary",
    "default_socket_path",
    "status_of",
]
