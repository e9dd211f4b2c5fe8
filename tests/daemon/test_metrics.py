"""The metrics listener: every metric in docs/metrics.md, valid for promtool, counting what happened."""

from __future__ import annotations

import subprocess

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.daemon_api import api, metric
from harness.tools import require_tool
from tests.deploy.deploy_files import documented_label_values

DESIGN_METRICS = [
    "shardcache_requests_total",
    "shardcache_open_wait_seconds",
    "shardcache_fetched_bytes_total",
    "shardcache_served_bytes_total",
    "shardcache_fetch_seconds",
    "shardcache_fetch_errors_total",
    "shardcache_evictions_total",
    "shardcache_prefetched_shards_total",
    "shardcache_resident_bytes",
    "shardcache_capacity_bytes",
    "shardcache_resident_shards",
    "shardcache_inflight_fetches",
    "shardcache_plans",
]


def test_a_live_scrape_passes_promtool_check_metrics(make_bucket, daemon_factory):
    promtool = require_tool("promtool")
    shards = make_bucket(count=2)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity="1MiB")
    with api(daemon) as http:
        for url in shards.s3_urls + [f"s3://{shards.bucket}/missing.tar"]:
            http.post("/v1/shards/open", json={"url": url})
        http.delete("/v1/shards", params={"url": shards.s3_urls[0]})
    scrape = httpx.get(daemon.metrics_url).text
    check = subprocess.run([promtool, "check", "metrics"], input=scrape, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for name in DESIGN_METRICS:
        assert f"\n{name}" in scrape, name


def test_metrics_count_hits_misses_bytes_and_capacity(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    size = shards.size_of(shards.names[0])
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], capacity="1MiB")
    with api(daemon) as http:
        for _ in range(3):
            http.post("/v1/shards/open", json={"url": shards.s3_urls[0]}).raise_for_status()
    assert metric(daemon, "shardcache_requests_total", 'result="miss"') == 1
    assert metric(daemon, "shardcache_requests_total", 'result="hit"') == 2
    assert metric(daemon, "shardcache_fetched_bytes_total") == size
    assert metric(daemon, "shardcache_served_bytes_total", 'mode="path"') == 3 * size
    assert metric(daemon, "shardcache_capacity_bytes") == 1024 * 1024
    assert metric(daemon, "shardcache_resident_shards") == 1
    assert metric(daemon, "shardcache_open_wait_seconds_count") == 3
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="not_found"') == 0


def test_every_documented_counter_series_exists_at_zero_on_a_fresh_daemon(daemon_factory, tmp_path):
    # A series born with its first event has no earlier sample: rate() and the alerts miss that event.
    # `metric()` reads an absent series as 0, so this parses the scrape and looks for each series itself.
    daemon = daemon_factory(allow=[str(tmp_path)])
    scrape = httpx.get(daemon.metrics_url, timeout=10).text
    present = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
    }
    expected = [
        (name, ((label, value),))
        for name, labels in documented_label_values().items()
        for label, values in labels.items()
        for value in sorted(values)
    ]
    missing = [f"{name}{{{lv[0][0]}={lv[0][1]!r}}}" for name, lv in expected if (name, lv) not in present]
    assert missing == [], f"{len(missing)} of {len(expected)} documented series are absent: {missing}"
    assert all(present[key] == 0 for key in expected)
