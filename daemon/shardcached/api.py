"""Routes of HTTP API v1 (DESIGN.md's table), served on the Unix socket.

Handlers are thin: validate with the shared wire models, call the service, shape the answer. The open
route builds its JSON answer directly, because it is the hot path.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request, Response, status
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from shardcache.protocol import (
    MAX_URL_LENGTH,
    URL_PATTERN,
    ErrorBody,
    Health,
    OpenRequest,
    OpenResponse,
    PlanRequest,
    PlanResponse,
    PrefetchRequest,
    ReleaseRequest,
    ShardInfo,
    ShardList,
    Stats,
    TelemetryReport,
)
from shardcached import __version__
from shardcached.errors import NotFound
from shardcached.service import ShardService
from shardcached.telemetry import ClientTelemetry

_JSON = "application/json"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
UrlQuery = Annotated[
    str, Query(min_length=1, max_length=MAX_URL_LENGTH, pattern=URL_PATTERN, description="shard URL")
]
# What each error status means; every answer of these carries an ErrorBody (app.py's handlers, hotpath.py).
_ERROR_MEANINGS = {
    400: "Malformed URL, checksum, range or body",
    403: "The URL is outside the daemon's allow-list (after canonicalisation)",
    404: "The remote object, lease, plan or resident shard does not exist",
    422: "The body or query does not match the schema",
    502: "The remote failed after retries, refused access, redirected, or sent other bytes",
    503: "The daemon is shutting down; retry against the next one",
    507: "The shard cannot fit in the cache (capacity, leases or disk space)",
}


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route answers, each with the ErrorBody schema."""
    return {code: {"model": ErrorBody, "description": _ERROR_MEANINGS[code]} for code in statuses}


class _NoFollowFileResponse(FileResponse):
    """A FileResponse that opens its file with O_NOFOLLOW: the daemon never streams through a symlink.

    The service checked the file with `lstat` (passed as `stat_result`, so starlette does not `stat`
    through links); O_NOFOLLOW closes the window between that check and the open. Overrides starlette's
    private `_open_file`; tests/daemon/test_cache_dir_files.py fails if that hook stops being used.
    """

    @contextlib.asynccontextmanager
    async def _open_file(self) -> AsyncIterator[anyio.AsyncFile[bytes]]:
        file = await anyio.open_file(self.path, mode="rb", opener=_open_nofollow)
        try:
            yield file
        finally:
            with anyio.CancelScope(shield=True):  # as starlette: close even when the transfer is cancelled
                await file.aclose()


def _open_nofollow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def _range_length(header: str | None, size: int) -> int:
    """Bytes a single-range request will be sent (for the served-bytes counter); the full size otherwise."""
    match = _RANGE.match(header.strip()) if header else None
    if match is None:
        return size
    first, last = match.groups()
    if not first:
        return min(int(last or 0), size)
    end = min(int(last), size - 1) if last else size - 1
    return max(0, end - int(first) + 1)


def build_router(service: ShardService, policy: str) -> APIRouter:
    """The v1 routes, bound to one service."""
    router = APIRouter(prefix="/v1")
    planner = service.planner
    store = service.store
    telemetry = ClientTelemetry(service.metrics.registry)

    @router.post("/telemetry", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(422))
    async def report_telemetry(body: TelemetryReport) -> Response:
        telemetry.record(body)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.get("/health")
    async def health() -> Health:
        return Health(status="ok", version=__version__)

    @router.post(
        "/shards/open", response_model=OpenResponse, responses=_errors(400, 403, 404, 422, 502, 503, 507)
    )
    async def open_shard(body: OpenRequest) -> Response:
        answer = await service.open(body.url, body.size, body.checksum, body.plan)
        return Response(answer.model_dump_json(), media_type=_JSON)

    @router.post("/shards/release", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(404, 422))
    async def release(body: ReleaseRequest) -> Response:
        if not service.release(body.lease):
            raise NotFound(
                f"lease {body.lease} is unknown or expired; open the shard again", code="unknown_lease"
            )
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.get(
        "/shards/data",
        response_class=FileResponse,
        responses={
            200: {"content": {"application/octet-stream": {}}, "description": "The shard's bytes"},
            **_errors(400, 403, 404, 422, 502, 503, 507),
        },
    )
    async def shard_data(request: Request, url: UrlQuery) -> FileResponse:
        entry, lease, file_stat = await service.lease_for_stream(url)
        service.count_served("stream", _range_length(request.headers.get("range"), entry.size))
        return _NoFollowFileResponse(
            entry.path,
            stat_result=file_stat,
            media_type="application/octet-stream",
            background=BackgroundTask(service.release, lease),
        )

    @router.post("/plans", responses=_errors(400, 403, 422))
    async def add_plan(body: PlanRequest) -> PlanResponse:
        urls = [service.allow.check(url) for url in body.urls]
        plan_id = planner.add_plan(body.job, body.slot, body.epoch, urls)
        service.wake_prefetcher()
        return PlanResponse(plan=plan_id)

    @router.get("/plans")
    async def list_plans() -> list[dict[str, object]]:
        return planner.describe()

    @router.delete("/plans/{plan_id}", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(404, 422))
    async def delete_plan(plan_id: str) -> Response:
        if not planner.delete_plan(plan_id):
            raise NotFound(f"plan {plan_id} is unknown (deleted, or dropped as stale)", code="unknown_plan")
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.post("/prefetch", status_code=status.HTTP_202_ACCEPTED, responses=_errors(400, 403, 422))
    async def prefetch(body: PrefetchRequest) -> dict[str, list[str]]:
        return {"urls": service.warm(body.urls)}

    @router.get("/shards")
    async def list_shards() -> ShardList:
        return ShardList(
            shards=[
                ShardInfo(
                    url=url,
                    size=entry.size,
                    last_use=entry.last_use,
                    next_use=planner.next_use(url),
                    pinned=entry.leases > 0,
                )
                for url, entry in store.by_url.items()
            ]
        )

    @router.delete("/shards", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(400, 403, 404, 422))
    async def evict(url: UrlQuery) -> Response:
        service.evict(url)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.get("/stats")
    async def stats() -> Stats:
        opens = service.hits + service.misses
        return Stats(
            capacity=store.capacity,
            used=store.used,
            resident_shards=len(store.by_url),
            hits=service.hits,
            misses=service.misses,
            hit_ratio=service.hits / opens if opens else 0.0,
            bytes_fetched=service.bytes_fetched,
            bytes_served=service.bytes_served,
            evictions=service.evictions,
            fetches_in_flight=service.inflight,
            plans=planner.plan_count,
            policy=policy,
        )

    return router
