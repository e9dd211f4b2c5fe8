"""Fixtures of the deployment tests: a real Prometheus server scraping a daemon with the repo's rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.deploy.deploy_files import PROMETHEUS, RULES_FILE
from tests.support.devservers import stop_process
from tests.support.prometheus import PrometheusServer, start_prometheus, write_config
from tests.support.tools import require_tool


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
