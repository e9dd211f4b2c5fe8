"""Trainer-side data-plane metrics: what clients report with `POST /v1/telemetry`, exported per job and slot.

Clients (`shardcache.Telemetry`) send, every few seconds, the samples they consumed, the seconds
their training step waited for the next item, the samples skipped as corrupt and, from newer clients, the
seconds their DataLoader workers spent in each pipeline part (`stage_seconds`: read, map[0], shuffle,
batch, collate, ...). The daemon adds them to `shardcache_client_*` counters labelled `training_job` and
`slot` (and `stage`), so one dashboard shows trainer starvation next to the hit ratio and where the
workers' time goes. Labels stay bounded whatever clients send: only the `max_jobs` most recently reporting
jobs keep series (the oldest job's series are removed when another job arrives), job names are cut to
`MAX_JOB_LABEL` characters, slots from `max_slots` up share the label `other`, and a job's stage names past
its first `max_stages` share the label `other`.

`summary()` answers `GET /v1/telemetry` (`shardcache stats --job`): each kept job's totals.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from shardcache_protocol import JobTelemetry, TelemetryReport, TelemetrySummary

logger = logging.getLogger(__name__)

MAX_JOBS = 8
MAX_SLOTS = 64
MAX_JOB_LABEL = 64
MAX_STAGES = 16
OTHER_SLOTS = "other"
OTHER_STAGES = "other"


@dataclass
class _JobSeries:
    """The label values one job has series for, and its totals for `summary()`."""

    slots: set[str] = field(default_factory=set)
    stages: set[str] = field(default_factory=set)  # at most max_stages names, then "other"
    samples: int = 0
    wait_seconds: float = 0.0
    corrupt_samples: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)


class ClientTelemetry:
    """The `shardcache_client_*` counters, on an injected registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        max_jobs: int = MAX_JOBS,
        max_slots: int = MAX_SLOTS,
        max_stages: int = MAX_STAGES,
    ):
        self.max_jobs = max_jobs
        self.max_slots = max_slots
        self.max_stages = max_stages
        labels = ["training_job", "slot"]  # not "job": Prometheus sets that label on every target
        self.samples = Counter(
            "shardcache_client_samples", "Samples consumed by trainers", labels, registry=registry
        )
        self.wait_seconds = Counter(
            "shardcache_client_wait_seconds",
            "Seconds trainers waited for their next item (data starvation)",
            labels,
            registry=registry,
        )
        self.corrupt_samples = Counter(
            "shardcache_client_corrupt_samples",
            "Samples trainers skipped as corrupt",
            labels,
            registry=registry,
        )
        self.stage_seconds = Counter(
            "shardcache_client_stage_seconds",
            "Seconds trainers' DataLoader workers spent in each pipeline part (read, each stage, collate)",
            [*labels, "stage"],
            registry=registry,
        )
        # job label -> its series, most recently reporting job last.
        self._jobs: OrderedDict[str, _JobSeries] = OrderedDict()

    def _slot_label(self, slot: int) -> str:
        return str(slot) if slot < self.max_slots else OTHER_SLOTS

    def record(self, report: TelemetryReport) -> None:
        """Add one report to the counters (forgetting the least recently reporting job if one too many)."""
        job = report.job[:MAX_JOB_LABEL]
        slot = self._slot_label(report.slot)
        series = self._jobs.pop(job, None)
        if series is None:
            series = _JobSeries()
            while len(self._jobs) >= self.max_jobs:
                self._forget(*self._jobs.popitem(last=False))
        self._jobs[job] = series
        series.slots.add(slot)
        self.samples.labels(job, slot).inc(report.samples)
        self.wait_seconds.labels(job, slot).inc(report.wait_seconds)
        self.corrupt_samples.labels(job, slot).inc(report.corrupt_samples)
        series.samples += report.samples
        series.wait_seconds += report.wait_seconds
        series.corrupt_samples += report.corrupt_samples
        for name, seconds in (report.stage_seconds or {}).items():
            stage = self._stage_label(series, name)
            self.stage_seconds.labels(job, slot, stage).inc(seconds)
            series.stage_seconds[stage] = series.stage_seconds.get(stage, 0.0) + seconds

    def _stage_label(self, series: _JobSeries, name: str) -> str:
        """`name`, or `other` once the job has `max_stages` names (a pipeline has a handful of stages)."""
        if name not in series.stages and len(series.stages) < self.max_stages:
            series.stages.add(name)
        return name if name in series.stages else OTHER_STAGES

    def _forget(self, job: str, series: _JobSeries) -> None:
        logger.info("telemetry: dropping the series of job %s (more than %d jobs report)", job, self.max_jobs)
        for slot in series.slots:
            for counter in (self.samples, self.wait_seconds, self.corrupt_samples):
                counter.remove(job, slot)
            for stage in (*series.stages, OTHER_STAGES):
                try:
                    self.stage_seconds.remove(job, slot, stage)
                except KeyError:
                    pass  # that slot never reported that stage

    def summary(self, job: str | None = None) -> TelemetrySummary:
        """The kept jobs' totals (only `job` when given), most recently reporting first."""
        kept = [(name, s) for name, s in reversed(self._jobs.items()) if job is None or name == job]
        return TelemetrySummary(
            jobs=[
                JobTelemetry(
                    job=name,
                    slots=len(s.slots),
                    samples=s.samples,
                    wait_seconds=s.wait_seconds,
                    corrupt_samples=s.corrupt_samples,
                    stage_seconds=dict(s.stage_seconds),
                )
                for name, s in kept
            ]
        )

    @property
    def jobs(self) -> list[str]:
        """Job labels with series, least recently reporting first."""
        return list(self._jobs)
