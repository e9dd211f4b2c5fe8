"""Serving: the HTTP API on the Unix socket, the metrics listener, and running both.

The package's face. `create_app` wires everything once (settings, store, planner, fetcher, service) into
the API's ASGI app (api: the v1 routes; hotpath: open and release before FastAPI's routing; listing and
streams: paged listings and streamed reads; telemetry: the trainers' reports); `serve` runs it and the
metrics listener on one event loop."""

from __future__ import annotations

from shardcached.serving.app import create_app, serving_app
from shardcached.serving.server import serve
from shardcached.serving.telemetry import OTHER_STAGES, ClientTelemetry

__all__ = [
    "ClientTelemetry",
    "OTHER_STAGES",
    "create_app",
    "serve",
    "serving_app",
]
