"""Fixtures of the deployment tests: a real Prometheus server scraping a daemon with the repo's rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from harness.devservers import stop_process
from harness.prometheus import PrometheusServer, start_prometheus, write_config
from harness.tools import require_tool
from tests.deploy.deploy_files import PROMETHEUS, RULES_FILE


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """Factory: Prometheus scraping `target` every second with `rule_files` (default: the repo's rules)."""
    binary = require_tool("prometheus")
    started: list[PrometheusServer] = []

    def start(target: str, rule_files: Sequence[Path] = (RULES_FILE,)) -> PrometheusServer:
        config = write_config(PROMETHEUS / "prometheus.yml", target, rule_files, tmp_path)
        server = start_prometheus(binary, config, tmp_path)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_process(server.process)
