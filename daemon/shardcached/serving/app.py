"""Assembly of the daemon's two ASGI apps: the API (Unix socket) and the metrics listener (TCP)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route

from shardcached import __version__
from shardcached.config import Settings
from shardcached.errors import DaemonError, error_body, validation_detail
from shardcached.fetching import Fetcher
from shardcached.keys import AllowList
from shardcached.metrics import Metrics, StateReaders
from shardcached.planning import Planner
from shardcached.service import ShardService
from shardcached.serving.api import build_router, health_answer
from shardcached.serving.hotpath import HotPath
from shardcached.storage import CacheDirLock, Store

logger = logging.getLogger(__name__)


def _error(status: int, code: str, detail: str) -> Response:
    return Response(error_body(code, detail), status_code=status, media_type="application/json")


def create_app(
    settings: Settings,
    store: Store,
    planner: Planner,
    registry: CollectorRegistry,
    lock: CacheDirLock | None = None,
) -> FastAPI:
    """The API app; its lifespan starts and stops the service (prefetcher, housekeeping, downloads).

    `lock`: the cache directory's lock, taken again when the directory is recreated (cachedir.py).

    The service is reachable as `app.state.service` (the server runner uses it to begin a shutdown).
    What is served is `serving_app(app)`: the app behind `HotPath`, which answers open and release before
    FastAPI's routing.
    """
    metrics = Metrics(registry)
    fetcher = Fetcher(
        retries=settings.retries,
        backoff_s=settings.retry_backoff_s,
        backoff_max_s=settings.retry_backoff_max_s,
        chunk_bytes=settings.chunk_bytes,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        on_error=lambda kind: metrics.fetch_errors.labels(kind).inc(),
        on_request=lambda op: metrics.remote_requests_by[op].inc(),
    )
    service = ShardService(
        store,
        planner,
        fetcher,
        AllowList(settings.allow),
        metrics,
        max_fetches=settings.max_fetches,
        evict_wait_s=settings.evict_wait_s,
        revalidate_after_s=settings.revalidate_after_s,
        immutable=settings.immutable,
        min_free=settings.min_free_bytes(),
        max_job_pinned=settings.max_job_pinned_bytes(store.capacity),
        lock=lock,
    )
    metrics.bind_state(
        StateReaders(
            resident_bytes=lambda: store.resident_bytes,
            capacity_bytes=lambda: store.capacity,
            resident_shards=lambda: len(store.by_url),
            inflight_fetches=lambda: service.inflight,
            plans=lambda: planner.plan_count,
            disk_free_bytes=service.space.disk_free,
            pins_by_job=lambda: {
                job: (ledger.leases, ledger.pinned_bytes) for job, ledger in store.pins.jobs.items()
            },
            validation_pending=lambda: service.freshness.bulk.pending,
        )
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.trim()
        service.start()
        yield
        await service.stop()

    app = FastAPI(
        title="shardcached",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        # FastAPI's OpenTelemetry hooks cost CPU on every request; the daemon exports Prometheus metrics.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.service = service
    app.include_router(build_router(service, settings.policy, settings.max_plan_urls))

    # One handler maps every domain error to its status; the others give framework errors the same shape.
    @app.exception_handler(DaemonError)
    async def daemon_error(request: Request, exc: DaemonError) -> Response:
        return _error(exc.status, exc.code, exc.detail)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _error(422, "invalid_request", validation_detail(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(
            exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail)
        )

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        logger.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
        return _error(500, "internal", f"{type(exc).__name__}: {exc}; see the daemon's log")

    return app


def serving_app(app: FastAPI) -> HotPath:
    """The API exactly as the daemon serves it on its socket: `app` behind the open/release hot path."""
    return HotPath(app, app.state.service)


def create_metrics_app(
    registry: CollectorRegistry, problem: Callable[[], str | None] = lambda: None
) -> Starlette:
    """The TCP listener's app: `GET /metrics` and `GET /v1/health` only; the data API is not served here.

    `problem`: why the daemon cannot serve now (None: it can), read on every health request.
    """

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def health(request: Request) -> Response:
        return health_answer(problem())

    return Starlette(routes=[Route("/metrics", metrics), Route("/v1/health", health)])
