"""A real Prometheus server in a subprocess: scraping one target every second, with rule files, on loopback.

The deploy tests check the daemon's metrics and the repository's rules through Prometheus's own HTTP API
(/api/v1/query, /series, /rules, /alerts), as an operator's server would see them.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from harness.devservers import free_tcp_port

DEADLINE_S = 60.0


def poll(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """Call `check` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {deadline_s:.0f}s waiting for {what}")


@dataclass
class PrometheusServer:
    url: str
    process: subprocess.Popen[bytes]

    def api(self, path: str, **params: Any) -> Any:
        """The `data` of a successful answer of `/api/v1/<path>`."""
        body = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body: dict[str, Any] = response.json()
        return body

    def vector(self, expr: str) -> list[dict[str, Any]]:
        body = self.query(expr)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def series(self, match: str) -> list[dict[str, str]]:
        """Every series matching `match` that has samples in the last hour (`/api/v1/series`)."""
        found: list[dict[str, str]] = self.api(
            "series", **{"match[]": match, "start": str(time.time() - 3600), "end": str(time.time())}
        )
        return found

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its `health`, `lastError` and, for alerts, `state` (`/api/v1/rules`)."""
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts with their labels (`/api/v1/alerts`)."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found


def write_config(scrape_config: Path, target: str, rule_files: Sequence[Path], tmp_path: Path) -> Path:
    """`scrape_config` (the repo's), pointed at `target`, scraping and evaluating every second."""
    config = yaml.safe_load(scrape_config.read_text())
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(path) for path in rule_files]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_prometheus(binary: str, config: Path, workdir: Path) -> PrometheusServer:
    """Start Prometheus on a free loopback port and wait until it is ready."""
    port = free_tcp_port()
    log_path = workdir / "prometheus.log"
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    server = PrometheusServer(f"http://127.0.0.1:{port}", process)

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text()[-2000:]
        try:
            return httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        poll("prometheus to become ready", ready)
    except BaseException:
        process.kill()
        process.wait(10)
        raise
    return server
