"""Routes of HTTP API v1, served on the Unix socket (the reference is docs/api.md, generated from them).

Handlers are thin: validate with the shared wire models, call the service, shape the answer. Open and
release are answered by hotpath.py's functions, before FastAPI's routing; their routes here document them
in the OpenAPI schema and delegate to the same functions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Path, Query, Request, Response, status
from fastapi.responses import FileResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.types import Scope

from shardcache_protocol import (
    MAX_URL_LENGTH,
    SHARDLIST_DIGEST,
    STATUS_MEANINGS,
    URL_PATTERN,
    ErrorBody,
    Health,
    JobPins,
    OpenGrant,
    OpenRequest,
    PlanRequest,
    PlanResponse,
    PrefetchAccepted,
    PrefetchRequest,
    ReleaseRequest,
    Revalidated,
    SessionGrant,
    SessionRequest,
    ShardList,
    ShardListAccepted,
    Stats,
    TelemetryReport,
    TelemetrySummary,
)
from shardcached import __version__
from shardcached.errors import DaemonError, NotFound, ShuttingDown
from shardcached.peers import PEER_SCOPE_KEY
from shardcached.planning import ShardListIds, ShardLists, read_plan, read_prefetch, read_shardlist
from shardcached.service import ShardService
from shardcached.serving.hotpath import answer_open, answer_release
from shardcached.serving.listing import DEFAULT_PAGE, MAX_PAGE, ShardListing
from shardcached.serving.streams import lease_for_stream
from shardcached.serving.telemetry import ClientTelemetry
from shardcached.sessions import SessionResponse
from shardcached.storage.pins import session_job

_JSON = "application/json"
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
UrlQuery = Annotated[
    str, Query(min_length=1, max_length=MAX_URL_LENGTH, pattern=URL_PATTERN, description="shard URL")
]


def _errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route answers, each with the ErrorBody schema."""
    return {code: {"model": ErrorBody, "description": STATUS_MEANINGS[code]} for code in statuses}


# A failing health check answers its own model, not an ErrorBody: probes read `status` and `detail`.
_FAILING_HEALTH: dict[int | str, dict[str, Any]] = {
    503: {
        "model": Health,
        "description": "The daemon cannot serve now (its cache directory vanished and cannot be recreated "
        'yet): status "failing", the reason in `detail`',
    }
}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a request body that the route reads raw (the hot path parses it)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }


def _raw(status_code: int, body: bytes) -> Response:
    return Response(body, status_code=status_code, media_type=_JSON if body else None)


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


def health_answer(problem: str | None) -> Response:
    """`GET /v1/health` on either listener: 200 ok, or 503 failing with the reason (`problem`)."""
    if problem is None:
        return Response(Health(version=__version__).model_dump_json(), media_type="application/json")
    body = Health(status="failing", version=__version__, detail=problem).model_dump_json()
    return Response(body, status_code=503, media_type="application/json")


def build_router(service: ShardService, policy: str, max_plan_urls: int = 4_000_000) -> APIRouter:
    """The v1 routes, bound to one service; plans longer than `max_plan_urls` are refused (413)."""
    router = APIRouter(prefix="/v1")
    planner = service.planner
    store = service.store
    listing = ShardListing(store, planner)
    shardlists = ShardLists()
    uploads: dict[str, asyncio.Future[ShardListIds]] = {}  # shard lists being read, by digest
    telemetry = ClientTelemetry(service.metrics.registry)

    @router.post("/telemetry", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(422))
    async def report_telemetry(body: TelemetryReport) -> Response:
        """One trainer slot's data-plane figures; exported as `shardcache_client_*` metrics."""
        telemetry.record(body)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.get("/telemetry", responses=_errors(422))
    async def telemetry_summary(job: str | None = None) -> TelemetrySummary:
        """The reporting jobs' totals (`job`: that one only): `shardcache stats --job`."""
        return telemetry.summary(job)

    @router.get("/health", response_model=Health, responses=_FAILING_HEALTH)
    async def health() -> Response:
        """Liveness, readiness and version (also served on the metrics listener): 503 with the reason in
        `detail` while the daemon cannot serve (its cache directory vanished and is not recreated yet)."""
        return health_answer(service.cache_dir.problem)

    @router.post(
        "/sessions",
        response_class=SessionResponse,
        responses={
            200: {
                "model": SessionGrant,
                "description": "The grant, as the first line of an answer that stays open",
            },
            # Its errors are JSON like every route's, though the grant's media type is NDJSON.
            **{
                code: {
                    "description": STATUS_MEANINGS[code],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
                }
                for code in (422, 503)
            },
        },
        summary="Start a session that ends with this connection",
    )
    async def start_session(body: SessionRequest) -> SessionResponse:
        """A client process starts one session and keeps this request's connection open for its life: the
        answer's first line is the grant (JSON), and the answer never ends while the connection stays open.
        Opens and plan registrations that name the session (`session`, on any connection) belong to it:
        when this connection closes (the process exited, however it died, in any PID namespace), their
        leases end at once and their plans after a few seconds unless another process registers them
        again. A request naming a session that ended is refused with 404 `unknown_session`."""
        if service.closing:
            raise ShuttingDown("the daemon is shutting down; start a session with the next one")

        def job(scope: Scope) -> str | None:
            peer = scope.get(PEER_SCOPE_KEY)
            return session_job(peer if isinstance(peer, int) else None, body.pid, body.host)

        return SessionResponse(service.owners.sessions, job)

    # Open and release: served by hotpath.HotPath in front of this app; these routes document them and,
    # reached without the middleware, answer through the very same functions.
    @router.post(
        "/shards/open",
        response_model=OpenGrant,
        responses=_errors(400, 403, 404, 422, 502, 503, 507),
        openapi_extra=_json_body(OpenRequest),
        summary="Make a shard local and lease it",
    )
    async def open_shard(request: Request) -> Response:
        """Answers once the shard is a complete local file: its path, and a lease that keeps the file until
        released (or until the lease expires). `hit` says whether it was resident when the open arrived; an
        open that joined a download in flight counts as a miss. With `size` or `checksum`, the cached copy
        is verified against them (502 `size_mismatch` / `checksum_mismatch` when the remote disagrees).
        With `plan`, the open advances that plan's cursor.
        """
        return _raw(*await answer_open(service, await request.body(), request.scope.get(PEER_SCOPE_KEY)))

    @router.post(
        "/shards/release",
        status_code=status.HTTP_204_NO_CONTENT,
        responses=_errors(400, 404, 422),
        openapi_extra=_json_body(ReleaseRequest),
        summary="End a lease",
    )
    async def release(request: Request) -> Response:
        """Ends a lease. Any request may instead carry `Shardcache-Release: lease1,lease2` (at most 64):
        those leases end before the request is served, unknown ones ignored."""
        return _raw(*answer_release(service, await request.body()))

    @router.get(
        "/shards/data",
        response_class=FileResponse,
        responses={
            200: {"content": {"application/octet-stream": {}}, "description": "The shard's bytes"},
            **_errors(400, 403, 404, 422, 502, 503, 507),
        },
    )
    async def shard_data(request: Request, url: UrlQuery) -> FileResponse:
        """The shard's bytes, for clients that cannot open the cached file; `Range: bytes=a-b` supported.
        The shard is leased while it is sent."""
        entry, lease, file_stat = await lease_for_stream(service, url)
        service.count_served("stream", _range_length(request.headers.get("range"), entry.size))
        return _NoFollowFileResponse(
            entry.path,
            stat_result=file_stat,
            media_type="application/octet-stream",
            background=BackgroundTask(service.release, lease),
        )

    @router.post(
        "/plans",
        response_model=PlanResponse,
        responses=_errors(400, 403, 404, 413, 422),
        openapi_extra=_json_body(PlanRequest),
    )
    async def add_plan(request: Request) -> PlanResponse:
        """Announce the ordered shards one slot of a job reads in one epoch (send the next epoch's too):
        the daemon prefetches the nearest-needed shards across all plans and evicts the one needed last.
        The plan belongs to the registering process (its `session`, else the process the socket names):
        once it exits, the plan goes after a few seconds unless another process registers it again (the
        next epoch's DataLoader workers do).
        A plan longer than `--max-plan-urls` is refused (413 `plan_too_large`). Answered once the plan's
        head is indexed; the rest of a long plan is indexed in the background within a few seconds.
        A job that begins (no plan of its id live and held by a running process) is never served a cached
        copy older than the remote at that moment: its plans' cached shards are checked against the remote
        in the background, by listings, and an open waits only for its own shard's check.
        `"immutable": true` skips that.
        The urls come as a list (`urls`), or as positions in a shard list uploaded before (`shardlist`, its
        digest, and `positions`, base64 of int32 little-endian): 404 `unknown_shardlist` when the daemon
        does not hold that list (upload it, then register again).
        """
        # Read raw and parsed in a worker thread: FastAPI would parse a 1M-url body on the event loop.
        chunks = [chunk async for chunk in request.stream()]
        body = await asyncio.to_thread(
            read_plan, chunks, service.allow, max_plan_urls, planner.table, shardlists
        )
        session = service.owners.sessions.named(body.session)  # 404 unknown_session before registering
        ended = service.freshness.ended(body.job)
        plan = service.indexer.register(body)
        service.freshness.plan_registered(plan, job_ended=ended, immutable=body.immutable)
        service.owners.plan_added(plan.id, request.scope.get(PEER_SCOPE_KEY), session)
        service.plans_changed()
        return PlanResponse(plan=plan.id)

    @router.put(
        "/shardlists/{digest}",
        response_model=ShardListAccepted,
        responses=_errors(400, 403, 409, 413, 422),
        openapi_extra={
            "requestBody": {"required": True, "content": {"text/plain": {"schema": {"type": "string"}}}}
        },
    )
    async def put_shardlist(
        request: Request,
        digest: Annotated[str, Path(pattern=SHARDLIST_DIGEST, description="sha256 of the body, hex")],
    ) -> ShardListAccepted:
        """Upload a job's shard list once: its urls one per line (UTF-8, `\\n` between them), named by the
        sha256 of that body. Plans then name positions in it (`POST /v1/plans` with `shardlist`), so each
        url is read and checked once per list, not once per plan. 409 `digest_mismatch` when the body's
        sha256 differs from `digest`; 403 naming the first url outside the allow-list; 413 past
        `--max-plan-urls`."""
        # Every reader process of a job may upload its list at once, on its first plan: the list is read
        # and checked once, the others wait for that reading (or take the list held already). The body is
        # received whole in any case, so the connection stays usable for the client's next request.
        chunks = [chunk async for chunk in request.stream()]
        listed = shardlists.find(digest)
        if listed is None and digest in uploads:
            with contextlib.suppress(DaemonError):  # that upload's body was refused; this one is read itself
                listed = await asyncio.shield(uploads[digest])
        if listed is None:
            reading = asyncio.ensure_future(
                asyncio.to_thread(read_shardlist, chunks, digest, service.allow, max_plan_urls, planner.table)
            )
            uploads.setdefault(digest, reading)
            try:
                listed = await reading
            finally:
                if uploads.get(digest) is reading:
                    del uploads[digest]
            shardlists.put(listed)
        return ShardListAccepted(shardlist=digest, urls=len(listed.ids))

    @router.get("/plans")
    async def list_plans() -> list[dict[str, object]]:
        """Registered plans with their cursors (for debugging; the shape may change)."""
        return planner.describe()

    @router.delete("/plans/{plan_id}", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(404, 422))
    async def delete_plan(plan_id: str) -> Response:
        """Forget a plan (a plan with no opens for `--plan-stale-s` is dropped anyway)."""
        if not planner.drop_plan(plan_id):
            raise NotFound(f"plan {plan_id} is unknown (deleted, or dropped as stale)", code="unknown_plan")
        service.indexer.wake()  # its index entries go in the background
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.post(
        "/prefetch",
        status_code=status.HTTP_202_ACCEPTED,
        responses=_errors(400, 403, 422),
        openapi_extra=_json_body(PrefetchRequest),
    )
    async def prefetch(request: Request) -> PrefetchAccepted:
        """Warm shards in the background; warming never evicts shards a plan needs."""
        # As a plan: read raw and checked in a worker thread, not on the event loop.
        chunks = [chunk async for chunk in request.stream()]
        urls = await asyncio.to_thread(read_prefetch, chunks, service.allow)
        return PrefetchAccepted(urls=service.warm(urls))

    @router.get("/shards", responses=_errors(422))
    async def list_shards(
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="shards per page")] = DEFAULT_PAGE,
        after: Annotated[
            str | None, Query(max_length=MAX_URL_LENGTH, description="`next_after` of the previous page")
        ] = None,
    ) -> ShardList:
        """Resident shards with their last and next use, one page ordered by url: follow `next_after`
        (pass it as `after`) until it is null. A shard resident for the whole walk appears exactly once."""
        return await listing.page(after, limit)

    @router.delete("/shards", status_code=status.HTTP_204_NO_CONTENT, responses=_errors(400, 403, 404, 422))
    async def evict(url: UrlQuery) -> Response:
        """Evict one shard; a leased file lives on until its leases end."""
        service.evict(url)
        return Response(status_code=status.HTTP_204_NO_CONTENT)

    @router.post("/shards/revalidate", responses=_errors(400, 403, 404, 422, 502, 503))
    async def revalidate(url: UrlQuery) -> Revalidated:
        """A client found the shard corrupt: compare the cached copy with the remote (size, ETag, mtime) at
        once and drop it when the remote changed, so the next open fetches the fixed shard."""
        resident, changed = await service.revalidate(url)
        return Revalidated(url=service.allow.check(url), resident=resident, changed=changed)

    @router.get("/stats")
    async def stats() -> Stats:
        """Capacity, usage and counters since start (bytes as integers), and the pins of each job."""
        opens = service.hits + service.misses
        jobs = sorted(store.pins.jobs.values(), key=lambda ledger: -ledger.pinned_bytes)
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
            pinned_bytes=store.pins.pinned_bytes,
            leases=store.lease_count,
            room_waits=service.space.room_waits,
            pinned_refusals=service.refusals.get("cache_pinned", 0),
            leases_of_exited=service.owners.leases_of_exited,
            sessions=len(service.owners.sessions),
            jobs=[JobPins(job=j.job, leases=j.leases, pinned_bytes=j.pinned_bytes) for j in jobs],
        )

    return router
