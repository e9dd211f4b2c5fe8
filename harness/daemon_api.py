"""Talking to a running daemon from a test: its HTTP API over the Unix socket, and its metrics."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.devservers import Daemon


def api(daemon: Daemon | str, timeout: float = 60.0) -> httpx.Client:
    """An httpx client speaking to the daemon's Unix socket."""
    socket = daemon if isinstance(daemon, str) else daemon.socket
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=socket), base_url="http://shardcached", timeout=timeout
    )


def metric(daemon: Daemon, name: str, labels: str = "") -> float:
    """One sample from a live scrape of the metrics listener (0 when absent)."""
    text = httpx.get(daemon.metrics_url, timeout=10).text
    pattern = re.escape(name) + (re.escape("{" + labels + "}") if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(r"^" + pattern + r"$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def client_samples(daemon: Daemon) -> dict[tuple[str, str, str], float]:
    """`(sample name, job, slot) -> value` of the daemon's `shardcache_client_*` series."""
    text = httpx.get(daemon.metrics_url, timeout=10).text
    return {
        (sample.name, sample.labels["training_job"], sample.labels["slot"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("shardcache_client_")
        for sample in family.samples
        if sample.name.endswith("_total")
    }
