"""The request and answer models of HTTP API v1 (JSON over the daemon's Unix socket)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

API_PREFIX = "/v1"
# A shard URL is at most this long; bounded so a hostile request cannot make the daemon hash megabytes.
MAX_URL_LENGTH = 4096
MAX_PLAN_URLS = 1_000_000
# No shard URL holds a control character; saying so in the schema makes such a URL a documented 422 at
# validation instead of a 400 from deep in the daemon's canonicaliser.
URL_PATTERN = r"^[^\x00-\x1f\x7f]*$"
ShardUrl = Annotated[str, Field(min_length=1, max_length=MAX_URL_LENGTH, pattern=URL_PATTERN)]
# Pipeline part names in telemetry (`read`, `map[0]`, `collate`): short, printable, a bounded number.
MAX_REPORT_STAGES = 64
# The most seconds one report may carry for one figure (about 31 years): the daemon sums reports, and a
# bound keeps every sum finite (an infinite total would not even serialise as a JSON number).
MAX_REPORT_SECONDS = 1e9
StageName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")]
# A session id as the daemon hands it out (`SessionGrant.session`), named by the opens and plans it owns.
SessionId = Annotated[
    str,
    Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="the session that holds it"),
]
SESSIONS_PATH = "/v1/sessions"


# Pydantic describes a dict with patterned keys as `patternProperties`, which lets a key outside the pattern
# through in the schema while validation refuses it; the schema says what validation does instead.
StageSeconds = Annotated[
    dict[StageName, Annotated[float, Field(ge=0, le=MAX_REPORT_SECONDS)]],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_REPORT_STAGES,
            "propertyNames": {"minLength": 1, "maxLength": 64, "pattern": r"^[\x21-\x7e]+$"},
            "additionalProperties": {"type": "number", "minimum": 0, "maximum": MAX_REPORT_SECONDS},
        }
    ),
]


class _Request(BaseModel):
    """What a client sends: unknown fields are refused (a typo in a request is a 422, not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Answer(BaseModel):
    """What the daemon answers: unknown fields are ignored, so a newer daemon that adds a field does not
    break an older trainer during a rolling upgrade."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Health(_Answer):
    """`GET /v1/health`: 200 with status "ok", or 503 with status "failing" and the reason in `detail`."""

    status: str = "ok"
    version: str
    detail: str | None = None


class OpenRequest(_Request):
    """`POST /v1/shards/open`: make a shard local and lease it."""

    url: ShardUrl
    size: int | None = Field(default=None, ge=0, description="expected size in bytes (checked)")
    checksum: str | None = Field(default=None, max_length=200, description="'<algo>:<hex>', e.g. 'sha256:…'")
    plan: str | None = Field(default=None, max_length=128, description="the plan this open advances")
    # Sent only to a daemon that granted a session (an older one refuses the field, and has no sessions).
    session: SessionId | None = Field(
        default=None, description="the session (`POST /v1/sessions`) that holds the lease; it ends with it"
    )


class OpenGrant(_Answer):
    """The answer to an open: where the shard's file is, and the lease that keeps it there until released."""

    url: str = Field(description="the canonical URL")
    path: str = Field(description="absolute path of the cached file; open it, then release the lease")
    size: int
    lease: str = Field(description="release it with `POST /v1/shards/release` or a Shardcache-Release header")
    hit: bool = Field(description="whether the shard was resident when the open arrived")


OpenResponse = OpenGrant  # the name before the grant had one of its own


class ReleaseRequest(_Request):
    """`POST /v1/shards/release`."""

    lease: str = Field(min_length=1, max_length=128)


# A shard list's name on the wire: the sha256 of its body, in lower-case hex.
SHARDLIST_DIGEST = r"^[0-9a-f]{64}$"


def _one_plan_form(schema: dict[str, Any]) -> None:
    """The schema of a plan says what validation accepts: `urls`, or `shardlist` and `positions`, never
    both forms and never null (pydantic would describe each as optional and nullable)."""
    properties = schema["properties"]
    for name in ("urls", "shardlist", "positions"):
        field = properties[name]
        options = field.pop("anyOf", [])
        field.update(next((o for o in options if o.get("type") != "null"), {}))
        field.pop("default", None)
    listed = [{"required": ["shardlist"]}, {"required": ["positions"]}]
    schema["oneOf"] = [
        {"required": ["urls"], "not": {"anyOf": listed}},
        {"required": ["shardlist", "positions"], "not": {"required": ["urls"]}},
    ]


class PlanRequest(_Request):
    """`POST /v1/plans`: the ordered shards one slot of a job reads in one epoch.

    Either `urls`, or `shardlist` and `positions`: the digest of a shard list uploaded with
    `PUT /v1/shardlists/{digest}` and the plan's positions in it, base64 of little-endian int32.
    """

    model_config = ConfigDict(json_schema_extra=_one_plan_form)

    job: str = Field(min_length=1, max_length=256)
    slot: int = Field(ge=0)
    epoch: int = Field(ge=0)
    # Bounded by the daemon's `--max-plan-urls` (413 plan_too_large beyond), not by the schema.
    urls: list[ShardUrl] | None = None
    shardlist: str | None = Field(default=None, pattern=SHARDLIST_DIGEST, description="a shard list's digest")
    positions: str | None = Field(
        default=None, description="base64 of the plan's positions in the shard list, int32 little-endian"
    )
    session: SessionId | None = Field(
        default=None, description="the session (`POST /v1/sessions`) that holds the plan; it ends with it"
    )
    # Sent only when true: a daemon older than the field refuses unknown request fields (422), and a client
    # then registers again without it.
    immutable: bool = Field(
        default=False,
        description="the shards are never rewritten in place: the daemon serves its cached copies to this "
        "plan without checking them against the remote",
    )

    @model_validator(mode="after")
    def _one_form(self) -> PlanRequest:
        given = self.model_fields_set
        by_urls = "urls" in given and self.urls is not None and not given & {"shardlist", "positions"}
        listed = self.shardlist is not None and self.positions is not None and "urls" not in given
        if not (by_urls or listed):
            raise ValueError("give either `urls`, or `shardlist` and `positions`")
        return self


class ShardListAccepted(_Answer):
    """`PUT /v1/shardlists/{digest}`: the shard list is known to the daemon from now on."""

    shardlist: str = Field(description="its digest, the sha256 of the body")
    urls: int = Field(description="how many urls it holds")


class SessionRequest(_Request):
    """`POST /v1/sessions`: start a session, which lasts as long as this request's connection stays open.

    `pid` and `host` are the client's own view of itself (its pid in its own PID namespace, its host
    name: a pod's name), shown as the job of its opens that name no plan; the daemon trusts them for
    nothing else.
    """

    pid: int | None = Field(default=None, ge=1, le=2**31, description="the client process's own pid")
    host: str | None = Field(
        default=None, max_length=253, pattern=r"^[\x21-\x7e]*$", description="the client's host name"
    )


class SessionGrant(_Answer):
    """The first line of `POST /v1/sessions`'s answer, whose body then stays open: the session's id.

    Leases and plans whose request names the session end when its connection closes (the client process
    exited, or hung up on purpose), whatever PID namespace the client runs in.
    """

    session: str = Field(description="name it as `session` in opens and plan registrations")
    job: str = Field(description="the job of this session's opens that name no plan (pin accounting)")


class PlanResponse(_Answer):
    plan: str


class PrefetchRequest(_Request):
    """`POST /v1/prefetch`: warm shards in the background."""

    urls: list[ShardUrl] = Field(min_length=1, max_length=MAX_PLAN_URLS)


class PrefetchAccepted(_Answer):
    urls: list[str] = Field(description="the canonical URLs being warmed")


class Revalidated(_Answer):
    """`POST /v1/shards/revalidate?url=`: a client found the shard corrupt; the daemon compared its copy
    with the remote (size, ETag, mtime) at once."""

    url: str = Field(description="the canonical URL")
    resident: bool = Field(description="whether the daemon held a copy of the shard")
    changed: bool = Field(description="the remote changed: the copy was dropped and the next open refetches")


class ShardInfo(_Answer):
    url: str
    size: int
    last_use: float | None = Field(description="Unix time of the last open, or null")
    next_use: float | None = Field(description="Distance to the next planned use (opens ahead), null if none")
    pinned: bool = False
    leases: int = Field(default=0, description="live leases on the shard")


class ShardList(_Answer):
    """`GET /v1/shards?limit=&after=`: one page of the resident shards, ordered by url."""

    shards: list[ShardInfo]
    next_after: str | None = Field(
        default=None, description="pass as `after` for the next page; null on the last page"
    )


class JobPins(_Answer):
    """One job's pins in `Stats.jobs`: a job is a plan's `job`, or `pid <n>` for opens without a plan."""

    job: str
    leases: int
    pinned_bytes: int = Field(description="bytes of the distinct shards the job's leases hold")


class Stats(_Answer):
    """`GET /v1/stats`: counters since the daemon started."""

    capacity: int = Field(description="bytes the cache may hold (`--capacity`, resolved)")
    used: int = Field(description="bytes resident, reserved by downloads, or evicted but still leased")
    resident_shards: int
    hits: int = Field(description="opens that found the shard resident")
    misses: int = Field(description="opens that fetched it or joined a download in flight")
    hit_ratio: float = Field(description="hits / (hits + misses), 0 before the first open")
    bytes_fetched: int = Field(description="bytes downloaded from remotes")
    bytes_served: int = Field(description="bytes handed over by path or streamed")
    evictions: int
    fetches_in_flight: int
    plans: int = Field(description="registered plans")
    policy: str = Field(description="the eviction policy: belady or lru")
    pinned_bytes: int = Field(default=0, description="bytes of the shards live leases hold")
    leases: int = Field(default=0, description="live leases")
    room_waits: int = Field(default=0, description="opens that waited for room (`--evict-wait-s`)")
    pinned_refusals: int = Field(default=0, description="opens refused at once: 507 `cache_pinned`")
    leases_of_exited: int = Field(
        default=0, description="leases ended because the process holding them exited or closed its session"
    )
    sessions: int = Field(default=0, description="open sessions (client processes holding a connection)")
    jobs: list[JobPins] = Field(default_factory=list, description="pins per job, largest first")


class TelemetryReport(_Request):
    """`POST /v1/telemetry`: one trainer slot's data-plane figures since its previous report."""

    job: str = Field(min_length=1, max_length=256)
    slot: int = Field(ge=0)
    samples: int = Field(ge=0, description="samples the trainer consumed in the interval")
    wait_seconds: float = Field(
        ge=0, le=MAX_REPORT_SECONDS, description="seconds the trainer waited for its next item"
    )
    corrupt_samples: int = Field(default=0, ge=0, description="samples skipped as corrupt")
    interval_seconds: float = Field(
        ge=0, le=MAX_REPORT_SECONDS, description="seconds since the previous report"
    )
    # Optional and omitted when empty: an older daemon refuses unknown request fields (422), so a newer
    # client leaves it out when it has nothing to say and drops it after such a refusal.
    stage_seconds: StageSeconds | None = Field(
        default=None,
        max_length=MAX_REPORT_STAGES,
        description="seconds the slot's workers spent in each pipeline part in the interval, by part "
        "name (read, map[0], shuffle, batch, collate, ...); exclusive, so they add up",
    )


class JobTelemetry(_Answer):
    """One training job's reported figures since the daemon started (or first heard of it), all slots."""

    job: str
    slots: int = Field(description="slots that reported")
    samples: int
    wait_seconds: float
    corrupt_samples: int = 0
    stage_seconds: dict[str, float] = Field(default_factory=dict, description="seconds per pipeline part")


class TelemetrySummary(_Answer):
    """`GET /v1/telemetry`: the reporting jobs' figures (the most recent jobs the daemon keeps)."""

    jobs: list[JobTelemetry] = Field(default_factory=list)
