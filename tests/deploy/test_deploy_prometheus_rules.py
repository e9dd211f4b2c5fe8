"""The Prometheus artefacts pass Prometheus's own checker and their unit tests (promtool)."""

from __future__ import annotations

import subprocess

import yaml

from harness.tools import require_tool
from tests.deploy.deploy_files import (
    PROMETHEUS,
    RULES_FILE,
    documented_metrics,
    load_rules,
    promql_metric_names,
    series_names,
)


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_tool("promtool")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_rule_file_passes_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(RULES_FILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_rule_unit_tests_pass_promtool_test_rules() -> None:
    tests = sorted((PROMETHEUS / "tests").glob("*.test.yml"))
    assert tests, "no promtool unit tests under deploy/prometheus/tests/"
    result = _promtool("test", "rules", *map(str, tests))
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_config_passes_promtool_check_config() -> None:
    result = _promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_scrape_config_is_valid_where_promtool_supports_kubernetes_sd() -> None:
    path = PROMETHEUS / "prometheus-kubernetes.yml"
    result = _promtool("check", "config", str(path))
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        # Debian builds Prometheus without the Kubernetes discovery plugin; check the shape instead.
        config = yaml.safe_load(path.read_text())
        (job,) = config["scrape_configs"]
        assert job["job_name"] == "shardcache"
        assert job["kubernetes_sd_configs"][0]["role"] == "pod"
        assert config["rule_files"] == ["rules/shardcache.rules.yml"]
        return
    assert result.returncode == 0, result.stdout + result.stderr


def test_scrape_configs_use_job_shardcache_that_the_down_alert_matches() -> None:
    for name in ("prometheus.yml", "prometheus-kubernetes.yml"):
        config = yaml.safe_load((PROMETHEUS / name).read_text())
        assert [job["job_name"] for job in config["scrape_configs"]] == ["shardcache"], name
    (down,) = [rule for rule in load_rules() if rule.get("alert") == "ShardcacheDown"]
    assert 'job="shardcache"' in down["expr"]


def test_rules_reference_only_documented_metrics_and_earlier_records() -> None:
    known = series_names(documented_metrics()) | {"up"}
    for rule in load_rules():
        unknown = promql_metric_names(rule["expr"]) - known
        assert not unknown, f"{rule.get('record') or rule.get('alert')} uses undocumented {sorted(unknown)}"
        if "record" in rule:
            known.add(rule["record"])


def test_every_alert_has_severity_summary_and_troubleshooting_link() -> None:
    alerts = [rule for rule in load_rules() if "alert" in rule]
    assert {rule["alert"] for rule in alerts} == {
        "ShardcacheLowHitRatio",
        "ShardcacheFetchErrors",
        "ShardcacheCacheFullNoEvictable",
        "ShardcacheCacheDiskFull",
        "ShardcacheCachePinned",
        "ShardcacheCacheDirLost",
        "ShardcacheTrainerStarvedByStage",
        "ShardcacheDown",
    }
    for rule in alerts:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert "docs/troubleshooting.md#" in rule["annotations"]["description"]
