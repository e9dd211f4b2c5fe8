"""Open and release, the two requests every shard read makes, served by one implementation.

FastAPI's routing, dependency resolution and response validation cost more CPU per request than the work
itself (a dict lookup and a lease); with 16 client processes on 2 cores that CPU is the open latency. So
`answer_open` and `answer_release` parse the body with the wire models and build the answer's bytes
themselves, and `HotPath`, an ASGI middleware in front of the FastAPI app, calls them before any routing.
The FastAPI routes of these two paths (api.py) exist for the OpenAPI schema and delegate to the same two
functions, so a request gets the same answer whichever way it arrives.

Any request may carry `Shardcache-Release: lease1,lease2`: those leases end before the request is served
(unknown or expired ones are ignored). A client that opens shards in a tight loop sends the release of the
shard it just closed with its next open: one request per shard instead of two.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from shardcache_protocol import OpenRequest, ReleaseRequest
from shardcached.errors import BadRequest, DaemonError, error_body, validation_detail
from shardcached.peers import PEER_SCOPE_KEY

if TYPE_CHECKING:
    from shardcached.service import ShardService

logger = logging.getLogger(__name__)

OPEN_PATH = "/v1/shards/open"
RELEASE_PATH = "/v1/shards/release"
MAX_BODY = 64 * 1024  # an open or release body is a few hundred bytes
RELEASE_HEADER = b"shardcache-release"  # ASGI servers lower-case header names
MAX_RELEASES_PER_HEADER = 64
_JSON_HEADERS = [(b"content-type", b"application/json")]


async def answer_open(service: ShardService, body: bytes, peer: int | None = None) -> tuple[int, bytes]:
    """`POST /v1/shards/open`: the status and JSON body answering the request `body` of process `peer`."""
    try:
        if len(body) > MAX_BODY:
            raise BadRequest(f"request body larger than {MAX_BODY} bytes", code="body_too_large")
        request = OpenRequest.model_validate_json(body)
        grant = await service.open(
            request.url, request.size, request.checksum, request.plan, peer, request.session
        )
    except ValidationError as exc:
        return 422, error_body("invalid_request", validation_detail(exc.errors()))
    except DaemonError as exc:
        return exc.status, error_body(exc.code, exc.detail)
    return 200, grant.model_dump_json().encode()


def answer_release(service: ShardService, body: bytes) -> tuple[int, bytes]:
    """`POST /v1/shards/release`: 204, or 404 `unknown_lease`, or a 4xx for a malformed body."""
    try:
        if len(body) > MAX_BODY:
            raise BadRequest(f"request body larger than {MAX_BODY} bytes", code="body_too_large")
        request = ReleaseRequest.model_validate_json(body)
    except ValidationError as exc:
        return 422, error_body("invalid_request", validation_detail(exc.errors()))
    except DaemonError as exc:
        return exc.status, error_body(exc.code, exc.detail)
    if service.release(request.lease):
        return 204, b""
    detail = f"lease {request.lease} is unknown or expired; open the shard again"
    return 404, error_body("unknown_lease", detail)


def release_header_leases(value: bytes) -> list[str]:
    """The leases a `Shardcache-Release` header names (at most 64)."""
    return [lease.strip() for lease in value.decode("latin-1").split(",")[:MAX_RELEASES_PER_HEADER]]


class HotPath:
    """ASGI middleware serving open and release without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp, service: ShardService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == RELEASE_HEADER:
                    self.service.release(*release_header_leases(value))
            if scope["method"] == "POST":
                path = scope["path"]
                if path == OPEN_PATH:
                    peer = scope.get(PEER_SCOPE_KEY)
                    status, body = await answer_open(self.service, await _read_body(receive), peer)
                    await _send(send, status, body)
                    return
                if path == RELEASE_PATH:
                    status, body = answer_release(self.service, await _read_body(receive))
                    await _send(send, status, body)
                    return
        await self.app(scope, receive, send)


async def _read_body(receive: Receive) -> bytes:
    """The request body; reading stops past `MAX_BODY` (the answer is then 400 `body_too_large`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if size > MAX_BODY or not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers += _JSON_HEADERS
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
