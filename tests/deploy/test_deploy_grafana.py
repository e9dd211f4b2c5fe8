"""The Grafana dashboard is valid JSON whose queries use only metrics that exist."""

from __future__ import annotations

import json
from typing import Any

from tests.deploy.deploy_files import (
    DEPLOY,
    documented_metrics,
    promql_metric_names,
    recorded_names,
    series_names,
)

DASHBOARD = DEPLOY / "grafana" / "shardcache.json"


def _dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def _exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def test_dashboard_is_json_with_uid_title_and_panels() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "shardcache-overview"
    assert dashboard["title"] == "shardcache"
    assert len(dashboard["panels"]) >= 8
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])


def test_every_query_uses_only_documented_metrics_or_recording_rules() -> None:
    known = series_names(documented_metrics()) | recorded_names()
    for title, expr in _exprs():
        unknown = promql_metric_names(expr) - known
        assert not unknown, f"panel {title!r} queries unknown {sorted(unknown)}"


def test_every_query_is_filtered_by_the_instance_variable() -> None:
    variables = {var["name"]: var for var in _dashboard()["templating"]["list"]}
    assert variables["instance"]["type"] == "query"
    assert "instance" in variables["instance"]["definition"]
    for title, expr in _exprs():
        assert 'instance=~"$instance"' in expr, f"panel {title!r} is not per node"


def test_dashboard_covers_the_promised_views() -> None:
    queried = set().union(*(promql_metric_names(expr) for _, expr in _exprs()))
    assert "instance:shardcache_hit_ratio:rate5m" in queried
    assert {"shardcache_fetched_bytes_total", "shardcache_served_bytes_total"} <= queried
    assert "shardcache_evictions_total" in queried
    assert "shardcache_prefetched_shards_total" in queried
    assert {"shardcache_resident_bytes", "shardcache_capacity_bytes"} <= queried
    assert any(
        "histogram_quantile" in expr and "shardcache_open_wait_seconds_bucket" in expr for _, expr in _exprs()
    )


def test_every_panel_uses_the_datasource_variable() -> None:
    for panel in _dashboard()["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
