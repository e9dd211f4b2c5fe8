"""Schemathesis against the daemon's own OpenAPI, over the ASGI app as served: no 5xx, no schema violation.

The app is assembled as server.py assembles it (`serving_app`: the FastAPI app behind the open/release hot
path), so the requests that production answers without FastAPI are fuzzed too. `POST /v1/sessions` is left
out: its answer lasts until the client hangs up, which an in-process ASGI client never does; its refusals
are tested over the real socket (tests/daemon/test_sessions.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry
from schemathesis.core.result import Err
from schemathesis.python import asgi
from schemathesis.specs.openapi.checks import positive_data_acceptance, status_code_conformance

from harness.shards import make_tar_shard
from shardcache_protocol import SESSIONS_PATH
from shardcached.config import Settings
from shardcached.planning import Planner
from shardcached.serving import create_app, serving_app
from shardcached.storage import Store

EXAMPLES_PER_OPERATION = 150  # 7 operations take inputs (4 take none): over 1,000 requests in all


def fuzz_daemon(tmp_path: Path, examples: int, excluded: list[Any]) -> dict[str, int]:
    """Send `examples` generated requests per operation to a fresh daemon app; requests sent per operation."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        make_tar_shard(data / f"shard_{i:06d}.tar", i, samples=2, payload_bytes=64)
    config = Settings(cache_dir=tmp_path / "cache", capacity="64MiB", allow=[str(data)], socket="/tmp/unused")
    store = Store(config.cache_dir, config.capacity_bytes(), config.lease_ttl_s)
    store.recover()
    app = serving_app(create_app(config, store, Planner(), CollectorRegistry()))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app).exclude(path=SESSIONS_PATH)
    sent: dict[str, int] = {}

    # schemathesis types an ASGI app's scope and messages as dict, Starlette's ASGI types (which FastAPI
    # and the hot path use) as MutableMapping; the app sends only dicts, so only the annotations disagree.
    with asgi.get_client(app) as client:  # type: ignore[arg-type]
        for result in schema.get_all_operations():
            if isinstance(result, Err):
                raise result.err()
            operation = result.ok()

            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def fuzz(case: schemathesis.Case[Any]) -> None:
                case.call_and_validate(session=client, excluded_checks=excluded)
                sent[case.operation.label] = sent.get(case.operation.label, 0) + 1

            fuzz()

    assert list(config.cache_dir.glob(".tmp-*")) == []
    return sent


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_over_a_thousand_generated_requests_get_no_5xx_and_documented_answers_match_the_schema(
    tmp_path: Path,
) -> None:
    # Every check but the two about what the schema fails to say, which the next test holds to separately.
    excluded = [status_code_conformance, positive_data_acceptance]
    sent = fuzz_daemon(tmp_path, EXAMPLES_PER_OPERATION, excluded=excluded)
    assert sum(sent.values()) >= 1000, sent


@pytest.mark.timeout(120)
def test_every_answer_status_is_documented_in_the_openapi_schema(tmp_path: Path) -> None:
    fuzz_daemon(tmp_path, 30, excluded=[])
