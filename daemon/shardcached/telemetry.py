"""Trainer-side data-plane metrics: what clients report with `POST /v1/telemetry`, exported per job and slot.

Clients (`shardcache.Telemetry`) send, every few seconds, the samples they consumed, the seconds
their training step waited for the next item and the samples skipped as corrupt. The daemon adds them to
`shardcache_client_*` counters labelled `training_job` and `slot`, so one dashboard shows trainer
starvation next to the hit ratio. Labels stay bounded whatever clients send: only the `max_jobs` most
recently reporting jobs keep series (the oldest job's series are removed when another job arrives), job
names are cut to `MAX_JOB_LABEL` characters, and slots from `max_slots` up share the label `other`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter

from shardcache_protocol import TelemetryReport

logger = logging.getLogger(__name__)

MAX_JOBS = 8
MAX_SLOTS = 64
MAX_JOB_LABEL = 64
OTHER_SLOTS = "other"


class ClientTelemetry:
    """The `shardcache_client_*` counters, on an injected registry."""

    def __init__(self, registry: CollectorRegistry, max_jobs: int = MAX_JOBS, max_slots: int = MAX_SLOTS):
        self.max_jobs = max_jobs
        self.max_slots = max_slots
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
        # job label -> slot labels seen, most recently reporting job last.
        self._jobs: OrderedDict[str, set[str]] = OrderedDict()

    def _slot_label(self, slot: int) -> str:
        return str(slot) if slot < self.max_slots else OTHER_SLOTS

    def record(self, report: TelemetryReport) -> None:
        """Add one report to the counters (forgetting the least recently reporting job if one too many)."""
        job = report.job[:MAX_JOB_LABEL]
        slot = self._slot_label(report.slot)
        slots = self._jobs.pop(job, None)
        if slots is None:
            slots = set()
            while len(self._jobs) >= self.max_jobs:
                self._forget(*self._jobs.popitem(last=False))
        self._jobs[job] = slots
        slots.add(slot)
        self.samples.labels(job, slot).inc(report.samples)
        self.wait_seconds.labels(job, slot).inc(report.wait_seconds)
        self.corrupt_samples.labels(job, slot).inc(report.corrupt_samples)

    def _forget(self, job: str, slots: set[str]) -> None:
        logger.info("telemetry: dropping the series of job %s (more than %d jobs report)", job, self.max_jobs)
        for slot in slots:
            for counter in (self.samples, self.wait_seconds, self.corrupt_samples):
                counter.remove(job, slot)

    @property
    def jobs(self) -> list[str]:
        """Job labels with series, least recently reporting first."""
        return list(self._jobs)
