"""A lean ASGI path for the two requests every shard read makes: open and release.

FastAPI's routing, dependency resolution and response validation cost more CPU per request than the work
itself (a dict lookup and a lease); with 16 client processes on 2 cores that CPU is the open latency. This
middleware answers `POST /v1/shards/open` and `POST /v1/shards/release` directly with the same wire models
and error shape; everything else (and the OpenAPI description of these two routes) stays with FastAPI.

Any request on this path may carry `Shardcache-Release: lease1,lease2`: those leases end before the request
is served (unknown or expired ones are ignored). A client that opens shards in a tight loop sends the
release of the shard it just closed with its next open: one request per shard instead of two.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from shardcache.protocol import OpenRequest, ReleaseRequest
from shardcached.errors import BadRequest, DaemonError
from shardcached.service import ShardService

logger = logging.getLogger(__name__)

_JSON_HEADERS = [(b"content-type", b"application/json")]
_MAX_BODY = 64 * 1024  # an open or release body is a few hundred bytes
RELEASE_HEADER = b"shardcache-release"  # ASGI servers lower-case header names


def error_body(code: str, detail: str) -> bytes:
    return json.dumps({"error": code, "detail": detail}).encode()


def validation_detail(errors: Sequence[Any]) -> str:
    """One line naming the first invalid fields (from pydantic's or FastAPI's `errors()`)."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) + "; see the API table in DESIGN.md"


class HotPath:
    """ASGI middleware serving open and release without FastAPI's per-request machinery."""

    def __init__(self, app: ASGIApp, service: ShardService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == RELEASE_HEADER:
                    self.service.release(
                        *(lease.strip() for lease in value.decode("latin-1").split(",")[:64])
                    )
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            if path == "/v1/shards/open":
                await self._open(receive, send)
                return
            if path == "/v1/shards/release":
                await self._release(receive, send)
                return
        await self.app(scope, receive, send)

    async def _open(self, receive: Receive, send: Send) -> None:
        try:
            request = OpenRequest.model_validate_json(await _read_body(receive))
            answer = await self.service.open(request.url, request.size, request.checksum, request.plan)
        except ValidationError as exc:
            await _send(send, 422, error_body("invalid_request", validation_detail(exc.errors())))
        except DaemonError as exc:
            await _send(send, exc.status, error_body(exc.code, exc.detail))
        else:
            await _send(send, 200, answer.model_dump_json().encode())

    async def _release(self, receive: Receive, send: Send) -> None:
        try:
            request = ReleaseRequest.model_validate_json(await _read_body(receive))
        except ValidationError as exc:
            await _send(send, 422, error_body("invalid_request", validation_detail(exc.errors())))
            return
        except DaemonError as exc:
            await _send(send, exc.status, error_body(exc.code, exc.detail))
            return
        if self.service.release(request.lease):
            await _send(send, 204, b"")
        else:
            detail = f"lease {request.lease} is unknown or expired; open the shard again"
            await _send(send, 404, error_body("unknown_lease", detail))


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > _MAX_BODY:
            raise BadRequest(f"request body larger than {_MAX_BODY} bytes", code="body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if body:
        headers += _JSON_HEADERS
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
