"""Through a real Prometheus: every documented series exists, every rule evaluates, the first error alerts.

A daemon serves a short job (a trainer script iterating a Dataset through it, then exiting at once) and one
open of a missing object; Prometheus scrapes it every second with the repo's rules. Checked through
Prometheus's HTTP API, not the exposition text, so a metric family without samples, or a series that
appears only with its first event, is caught as Prometheus sees it.

The rule file is loaded as shipped, plus a test copy of its alerts renamed `<name>Now` with `for:` removed:
the shipped `ShardcacheFetchErrors` must be pending and its copy firing after one `not_found` error.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from harness.devservers import Daemon
from harness.prometheus import PrometheusServer, poll
from tests.deploy.deploy_files import RULES_FILE, documented_label_values, documented_metrics, series_names

JOB = "prom-live"
TRAINER = textwrap.dedent(
    """
    import sys
    from shardcache import Dataset

    ds = Dataset.from_source("tars", sys.argv[2:], daemon=sys.argv[1], job="prom-live")
    assert sum(1 for _ in ds) == 32
    """
)


def _alerts_fired_at_once(tmp_path: Path) -> Path:
    """A copy of the shipped alerts, renamed `<name>Now`, without `for:` (recording rules left out)."""
    shipped = yaml.safe_load(RULES_FILE.read_text())
    alerts = []
    for group in shipped["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                copy = {key: value for key, value in rule.items() if key != "for"}
                alerts.append({**copy, "alert": rule["alert"] + "Now"})
    path = tmp_path / "alerts-now.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "shardcache.alerts.now", "rules": alerts}]}))
    return path


def _alert(prometheus: PrometheusServer, name: str, state: str, **labels: str) -> dict[str, Any] | None:
    for alert in prometheus.alerts():
        found = alert["labels"]
        if found["alertname"] == name and alert["state"] == state:
            if all(found.get(key) == value for key, value in labels.items()):
                return alert
    return None


def test_documented_series_rules_and_the_first_fetch_error_through_prometheus(
    daemon_factory: Callable[..., Daemon],
    prometheus_factory: Callable[..., PrometheusServer],
    local_shards: Any,
    tmp_path: Path,
) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    prometheus = prometheus_factory(
        f"127.0.0.1:{daemon.metrics_port}", [RULES_FILE, _alerts_fired_at_once(tmp_path)]
    )
    # The error's series must already be in Prometheus, at 0, before the error: else rate() cannot see it.
    poll(
        "two zero samples of the not_found series before any error",
        lambda: prometheus.vector(
            'count_over_time(shardcache_fetch_errors_total{kind="not_found"}[1m]) >= 2'
        ),
    )

    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    run = subprocess.run(
        [sys.executable, str(script), daemon.socket, *local_shards.local_paths],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    missing_url = str(local_shards.local_dir / "missing.tar")
    with httpx.Client(transport=httpx.HTTPTransport(uds=daemon.socket), base_url="http://d") as client:
        answer = client.post("/v1/shards/open", json={"url": missing_url})
    assert answer.status_code == 404 and answer.json()["error"] == "remote_not_found"

    # The first error alerts: pending under the shipped rule (for: 5m), firing under its copy without for.
    poll(
        "ShardcacheFetchErrorsNow firing",
        lambda: _alert(prometheus, "ShardcacheFetchErrorsNow", "firing"),
        30,
    )
    poll(
        "ShardcacheFetchErrors pending for kind not_found",
        lambda: _alert(prometheus, "ShardcacheFetchErrors", "pending", kind="not_found"),
        30,
    )

    # The trainer's last report arrived before its interpreter exited: every sample of the job is counted.
    poll(
        "the trainer's samples in Prometheus",
        lambda: prometheus.vector(f'shardcache_client_samples_total{{training_job="{JOB}"}} == 32'),
    )

    # Every documented metric has a series with samples, and every documented label value its own.
    present = prometheus.series('{__name__=~"shardcache_.+"}')
    names = {series["__name__"] for series in present}
    documented = series_names(documented_metrics())
    assert sorted(documented - names) == []
    labelled = {(s["__name__"], label, s[label]) for s in present for label in s if label != "__name__"}
    wanted = {
        (name, label, value)
        for name, labels in documented_label_values().items()
        for label, values in labels.items()
        for value in values
    }
    assert sorted(wanted - labelled) == []

    # Every rule has been evaluated without error.
    def all_evaluated() -> list[dict[str, Any]] | None:
        rules = prometheus.rules()
        return rules if all(rule["health"] != "unknown" for rule in rules) else None

    rules = poll("every rule evaluated once", all_evaluated)
    failing = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert failing == {}
    print(
        f"\nprometheus: {len(documented)} documented series names, {len(documented & names)} present; "
        f"{len(wanted & labelled)} of {len(wanted)} documented label values; "
        f"{sum(rule['health'] == 'ok' for rule in rules)} of {len(rules)} rules ok; "
        f"ShardcacheFetchErrors pending, its for-less copy firing after one not_found error"
    )
