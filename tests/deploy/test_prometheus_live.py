"""A real Prometheus scrapes a real daemon with the repo's scrape config and rules.

The recorded hit ratio must equal the daemon's own `/v1/stats` figure, every dashboard query must be valid
PromQL to the real server, and the metrics the daemon exports must be exactly the documented ones.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness.devservers import Daemon
from harness.prometheus import PrometheusServer
from harness.prometheus import poll as _poll
from harness.tools import require_tool
from tests.deploy.deploy_files import DEPLOY, documented_metrics


def _api(daemon: Daemon) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=daemon.socket), base_url="http://shardcached")


def _open_and_release(client: httpx.Client, url: str) -> bool:
    response = client.post("/v1/shards/open", json={"url": url})
    response.raise_for_status()
    opened = response.json()
    client.post("/v1/shards/release", json={"lease": opened["lease"]}).raise_for_status()
    hit: bool = opened["hit"]
    return hit


def test_recorded_hit_ratio_matches_the_daemons_counters(
    daemon_factory: Callable[..., Daemon],
    prometheus_factory: Callable[[str], PrometheusServer],
    local_shards: Any,
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    prometheus = prometheus_factory(f"127.0.0.1:{daemon.metrics_port}")
    # Every series must have a zero sample in Prometheus before the first open, so rate() extrapolates
    # all of them alike and the ratio of rates is the ratio of counts.
    _poll("a first scrape", lambda: prometheus.vector('shardcache_requests_total{result="hit"} == 0'))

    a, b, c = local_shards.local_paths[:3]
    with _api(daemon) as client:
        hits = [_open_and_release(client, url) for url in (a, a, b, a, b, c, c)]
        stats = client.get("/v1/stats").json()
    assert hits == [False, True, False, True, True, False, True]
    assert (stats["hits"], stats["misses"]) == (4, 3)

    # Wait until Prometheus has scraped the final counters, then until the rule has been evaluated on them.
    _poll("the final scrape", lambda: prometheus.vector("sum(shardcache_requests_total) == 7"))
    expected = stats["hit_ratio"]

    def recorded() -> float | None:
        result = prometheus.vector('instance:shardcache_hit_ratio:rate5m{instance="127.0.0.1"}')
        value = float(result[0]["value"][1]) if result else None
        return value if value is not None and abs(value - expected) < 1e-9 else None

    _poll(f"the recorded hit ratio to reach the daemon's {expected}", recorded)
    assert expected == pytest.approx(4 / 7)


def test_every_dashboard_query_is_valid_promql_with_the_rules_loaded(
    daemon_factory: Callable[..., Daemon],
    prometheus_factory: Callable[[str], PrometheusServer],
    local_shards: Any,
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    prometheus = prometheus_factory(f"127.0.0.1:{daemon.metrics_port}")
    dashboard = yaml.safe_load((DEPLOY / "grafana" / "shardcache.json").read_text())
    variables = {"$instance": ".+", "$__rate_interval": "1m"}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            body = prometheus.query(expr)
            assert body["status"] == "success", f"panel {panel['title']!r}: {body}"


def test_exported_metrics_are_exactly_the_documented_ones(
    daemon_factory: Callable[..., Daemon], tmp_path
) -> None:
    daemon = daemon_factory(allow=[str(tmp_path)])
    with _api(daemon) as client:  # the trainer metrics have series once a trainer reported
        report = {"job": "doc-check", "slot": 0, "samples": 1, "wait_seconds": 0.0, "corrupt_samples": 0}
        report["stage_seconds"] = {"read": 0.5}  # stage series exist once a client reported stage times
        client.post("/v1/telemetry", json={**report, "interval_seconds": 1.0}).raise_for_status()
    text = httpx.get(daemon.metrics_url, timeout=10).text
    exported = {
        family.name: family.type
        for family in text_string_to_metric_families(text)
        # `*_created` are prometheus_client's creation timestamps of counters and histograms, not metrics.
        if family.name.startswith("shardcache_")
        and not family.name.endswith("_created")
        # A family with HELP and TYPE but no sample is invisible to Prometheus: not exported.
        and family.samples
    }
    # The parser names counter families without `_total`; the documentation uses the sample name.
    documented = {
        (name.removesuffix("_total") if kind == "counter" else name): kind
        for name, kind in documented_metrics().items()
    }
    assert exported == documented


def test_live_scrape_passes_promtool_check_metrics(daemon_factory: Callable[..., Daemon], tmp_path) -> None:
    promtool = require_tool("promtool")
    daemon = daemon_factory(allow=[str(tmp_path)])
    text = httpx.get(daemon.metrics_url, timeout=10).text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
