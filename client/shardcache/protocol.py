"""Wire models shared by the daemon and the client (HTTP API v1, JSON over a Unix socket).

This is the only module the daemon imports from the client package; keep it free of heavy imports.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

API_PREFIX = "/v1"
SOCKET_ENV = "SHARDCACHE_SOCKET"
SOCKET_NAME = "shardcache.sock"
ROOT_SOCKET_PATH = "/run/shardcache/shardcache.sock"
DEFAULT_METRICS_ADDR = "127.0.0.1:9464"

# A shard URL is at most this long; bounded so a hostile request cannot make the daemon hash megabytes.
MAX_URL_LENGTH = 4096
MAX_PLAN_URLS = 1_000_000
# No shard URL holds a control character; saying so in the schema makes such a URL a documented 422 at
# validation instead of a 400 from deep in the daemon's canonicaliser.
URL_PATTERN = r"^[^\x00-\x1f\x7f]*$"
ShardUrl = Annotated[str, Field(min_length=1, max_length=MAX_URL_LENGTH, pattern=URL_PATTERN)]


def default_socket_path() -> str:
    """The socket path both sides agree on when none is configured.

    `SHARDCACHE_SOCKET` wins; otherwise `/run/shardcache/shardcache.sock` as root and
    `$XDG_RUNTIME_DIR/shardcache.sock` for other users (falling back to /tmp/shardcache-<uid>/).
    """
    from_env = os.environ.get(SOCKET_ENV)
    if from_env:
        return from_env
    if os.geteuid() == 0:
        return ROOT_SOCKET_PATH
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")
    if runtime_dir:
        return str(Path(runtime_dir) / SOCKET_NAME)
    return f"/tmp/shardcache-{os.geteuid()}/{SOCKET_NAME}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Health(_Model):
    status: str = "ok"
    version: str


class OpenRequest(_Model):
    url: ShardUrl
    size: int | None = Field(default=None, ge=0)
    checksum: str | None = Field(default=None, max_length=200, description="'<algo>:<hex>', e.g. 'sha256:…'")
    plan: str | None = Field(default=None, max_length=128)


class OpenResponse(_Model):
    url: str
    path: str
    size: int
    lease: str
    hit: bool


class ReleaseRequest(_Model):
    lease: str = Field(min_length=1, max_length=128)


class PlanRequest(_Model):
    job: str = Field(min_length=1, max_length=256)
    slot: int = Field(ge=0)
    epoch: int = Field(ge=0)
    urls: list[ShardUrl] = Field(max_length=MAX_PLAN_URLS)


class PlanResponse(_Model):
    plan: str


class PrefetchRequest(_Model):
    urls: list[ShardUrl] = Field(min_length=1, max_length=MAX_PLAN_URLS)


class ShardInfo(_Model):
    url: str
    size: int
    last_use: float | None = Field(description="Unix time of the last open, or null")
    next_use: float | None = Field(description="Distance to the next planned use (opens ahead), null if none")
    pinned: bool = False


class ShardList(_Model):
    shards: list[ShardInfo]


class Stats(_Model):
    capacity: int
    used: int
    resident_shards: int
    hits: int
    misses: int
    hit_ratio: float
    bytes_fetched: int
    bytes_served: int
    evictions: int
    fetches_in_flight: int
    plans: int
    policy: str


class ErrorBody(_Model):
    error: str
    detail: str


class TelemetryReport(_Model):
    """`POST /v1/telemetry`: one trainer slot's data-plane figures since its previous report."""

    job: str = Field(min_length=1, max_length=256)
    slot: int = Field(ge=0)
    samples: int = Field(ge=0, description="samples the trainer consumed in the interval")
    wait_seconds: float = Field(ge=0, description="seconds the trainer waited for its next item")
    corrupt_samples: int = Field(default=0, ge=0, description="samples skipped as corrupt")
    interval_seconds: float = Field(ge=0, description="seconds since the previous report")
