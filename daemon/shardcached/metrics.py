"""Prometheus metrics of the daemon, on an injected `CollectorRegistry` (no global registry).

Gauges of the cache's state are read at scrape time from callbacks, so the hot path only bumps counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# An open waits from microseconds (hit) to minutes (a 2 GB miss on a slow remote).
_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_FETCH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The codes of the 507 answers (`shardcache_protocol.ERROR_CODES`), the `code` label of refused opens.
REFUSAL_CODES = ("cache_disk_full", "cache_pinned", "insufficient_capacity")
# Jobs with their own series in the per-job pin gauges, largest first; the rest are summed as `other`.
PIN_JOB_SERIES = 8
# Every `kind` a failed fetch attempt is counted under (retries.py, service.py), docs/metrics.md's list.
FETCH_ERROR_KINDS = (
    "transient",
    "not_found",
    "forbidden",
    "redirect",
    "client_error",
    "disk_full",
    "size_mismatch",
    "checksum_mismatch",
    "bad_checksum",
    "remote_changed",
)
# Every `reason` an eviction is counted under (space.py's callers), docs/metrics.md's list.
# Why leases ended without a release: their process exited (seen by pid), their session's connection
# closed, or their TTL ran out.
ABANDON_REASONS = ("process_exit", "session_closed", "ttl")
EVICTION_REASONS = ("capacity", "prefetch", "manual", "stale", "disk_full", "checksum_mismatch", "invalid")
# Every `op` a request to a remote is counted under (fetcher.py, versions.py), docs/metrics.md's list.
REMOTE_OPS = ("head", "get", "list")
# Every `result` of checking a cached copy against the remote (freshness.py), docs/metrics.md's list.
VALIDATION_RESULTS = ("unchanged", "changed", "missing")


@dataclass(frozen=True)
class StateReaders:
    """Callbacks that read the cache's current state for the gauges."""

    resident_bytes: Callable[[], float]
    capacity_bytes: Callable[[], float]
    resident_shards: Callable[[], float]
    inflight_fetches: Callable[[], float]
    plans: Callable[[], float]
    disk_free_bytes: Callable[[], float]
    # job -> (live leases, pinned bytes), read at scrape time
    pins_by_job: Callable[[], Mapping[str, tuple[int, int]]] = dict
    validation_pending: Callable[[], float] = lambda: 0


class Metrics:
    """Every metric of the daemon (docs/metrics.md lists them), registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("shardcache_requests", "Shard opens by result", ["result"], registry=registry)
        # Children bound once: the hot path skips the label lookup.
        self.requests_by = {result: self.requests.labels(result) for result in ("hit", "inflight", "miss")}
        self.open_wait = Histogram(
            "shardcache_open_wait_seconds",
            "How long an open waited for its shard to be local",
            buckets=_WAIT_BUCKETS,
            registry=registry,
        )
        self.fetched_bytes = Counter(
            "shardcache_fetched_bytes", "Bytes downloaded from remotes", registry=registry
        )
        self.served_bytes = Counter(
            "shardcache_served_bytes", "Bytes handed to clients", ["mode"], registry=registry
        )
        self.served_by = {mode: self.served_bytes.labels(mode) for mode in ("path", "stream")}
        self.fetch_seconds = Histogram(
            "shardcache_fetch_seconds",
            "Duration of completed downloads",
            buckets=_FETCH_BUCKETS,
            registry=registry,
        )
        self.fetch_errors = Counter(
            "shardcache_fetch_errors", "Failed download attempts by kind", ["kind"], registry=registry
        )
        self.evictions = Counter(
            "shardcache_evictions", "Shards removed from the cache by reason", ["reason"], registry=registry
        )
        # Every counter whose label values are known has its zero series from the start: a series that
        # appears only with its first event has no earlier sample, so rate()/increase() over it stay empty
        # and an alert on "any error" never sees the first one.
        for kind in FETCH_ERROR_KINDS:
            self.fetch_errors.labels(kind)
        for reason in EVICTION_REASONS:
            self.evictions.labels(reason)
        self.prefetched = Counter(
            "shardcache_prefetched_shards",
            "Prefetched shards by outcome: opened before eviction or evicted unused",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("used", "evicted_unused"):
            self.prefetched.labels(outcome)
        self.refused_opens = Counter(
            "shardcache_refused_opens",
            "Opens answered 507 by error code: cache_disk_full or insufficient_capacity",
            ["code"],
            registry=registry,
        )
        self.room_waits = Counter(
            "shardcache_room_waits",
            "Opens that waited for leases or downloads to give back room, by what was short",
            ["reason"],
            registry=registry,
        )
        for code in REFUSAL_CODES:  # zero series from the start, as above
            self.refused_opens.labels(code)
        for reason in ("capacity", "disk_full"):
            self.room_waits.labels(reason)
        self.abandoned_leases = Counter(
            "shardcache_abandoned_leases",
            "Leases ended without a release: their process exited, their session closed, or the TTL ran out",
            ["reason"],
            registry=registry,
        )
        for reason in ABANDON_REASONS:
            self.abandoned_leases.labels(reason)
        self.remote_requests = Counter(
            "shardcache_remote_requests",
            "Requests sent to remote storage, by operation: head, get (a download attempt), list",
            ["op"],
            registry=registry,
        )
        # Children bound once: downloads count from their threads without a label lookup.
        self.remote_requests_by = {op: self.remote_requests.labels(op) for op in REMOTE_OPS}
        self.validations = Counter(
            "shardcache_validations",
            "Cached shards checked against the remote's current version, by result",
            ["result"],
            registry=registry,
        )
        self.validations_by = {result: self.validations.labels(result) for result in VALIDATION_RESULTS}
        self.cache_dir_losses = Counter(
            "shardcache_cache_dir_losses",
            "Times the cache directory vanished or was replaced while the daemon ran",
            registry=registry,
        )
        self._gauges: dict[str, Gauge] = {}

    def bind_state(self, readers: StateReaders) -> None:
        """Register the state gauges, read through `readers` at scrape time."""
        specs = {
            "shardcache_resident_bytes": ("Bytes of shards in the cache", readers.resident_bytes),
            "shardcache_capacity_bytes": ("Configured cache capacity", readers.capacity_bytes),
            "shardcache_resident_shards": ("Shards in the cache", readers.resident_shards),
            "shardcache_inflight_fetches": ("Downloads in progress", readers.inflight_fetches),
            "shardcache_plans": ("Plans the daemon holds", readers.plans),
            "shardcache_disk_free_bytes": (
                "Free bytes of the cache filesystem (statvfs f_bavail; -1 when unknown)",
                readers.disk_free_bytes,
            ),
            "shardcache_validation_pending_shards": (
                "Cached shards of registered plans waiting to be checked against the remote",
                readers.validation_pending,
            ),
        }
        for name, (doc, read) in specs.items():
            gauge = Gauge(name, doc, registry=self.registry)
            gauge.set_function(read)
            self._gauges[name] = gauge
        self.registry.register(_PinsCollector(readers.pins_by_job))


class _PinsCollector(Collector):
    """`shardcache_pinned_bytes` and `shardcache_leases` per `training_job`, read at scrape time.

    Jobs come and go with their leases, so the series are built at each scrape (no stale series stay);
    the `PIN_JOB_SERIES` largest jobs by pinned bytes keep their own, the others are summed as `other`
    (present, at 0, when there are no others).
    """

    def __init__(self, read: Callable[[], Mapping[str, tuple[int, int]]]) -> None:
        self._read = read

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families({}))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return iter(self._families(self._read()))

    @staticmethod
    def _families(pins: Mapping[str, tuple[int, int]]) -> list[GaugeMetricFamily]:
        pinned = GaugeMetricFamily(
            "shardcache_pinned_bytes",
            "Bytes of the shards a job's live leases hold",
            labels=["training_job"],
        )
        leases = GaugeMetricFamily("shardcache_leases", "Live leases of a job", labels=["training_job"])
        ranked = sorted(pins.items(), key=lambda item: -item[1][1])
        rows = [(job[:64], count, size) for job, (count, size) in ranked[:PIN_JOB_SERIES]]
        rest = ranked[PIN_JOB_SERIES:]
        # `other` is always there (0 without more jobs): the families have a series from the start, so a
        # query or an alert on them never meets "no data" on an idle node.
        rows.append(("other", sum(c for _, (c, _) in rest), sum(b for _, (_, b) in rest)))
        for job, count, size in rows:
            pinned.add_metric([job], size)
            leases.add_metric([job], count)
        return [pinned, leases]
