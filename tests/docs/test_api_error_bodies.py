"""The error bodies docs/api.md documents (the app's OpenAPI schema, from which the page is generated) are
the bodies the daemon sends: every error answers an ErrorBody except a failing health check, which answers
its own Health model; and the real daemon's answers validate against the documented models."""

from __future__ import annotations

import shutil
from typing import Any

import shardcache_protocol
from harness.daemon_api import api
from harness.polling import wait_for
from tests.docs.test_api_doc import generator

FAILING_HEALTH = ("/v1/health", "get", "503")


def documented_error_models() -> dict[tuple[str, str, str], str]:
    """(path, method, status) -> the model name the reference gives the body of each error status."""
    found = {}
    for path, methods in generator()._schema()["paths"].items():
        for method, operation in methods.items():
            for status, answer in operation.get("responses", {}).items():
                if int(status) < 400:
                    continue
                schema = answer["content"]["application/json"]["schema"]
                found[(path, method, status)] = schema["$ref"].rsplit("/", 1)[-1]
    return found


def documented(path: str, method: str, status: int) -> type[Any]:
    """The wire model the reference documents for that answer (from `shardcache_protocol`)."""
    model: type[Any] = getattr(shardcache_protocol, documented_error_models()[(path, method, str(status))])
    return model


def test_every_documented_error_is_an_error_body_but_a_failing_health_check() -> None:
    models = documented_error_models()
    assert models[FAILING_HEALTH] == "Health"
    others = {key: name for key, name in models.items() if key != FAILING_HEALTH}
    assert others and set(others.values()) == {"ErrorBody"}, {
        k: v for k, v in others.items() if v != "ErrorBody"
    }


def test_a_failing_health_check_answers_the_documented_body(daemon_factory, local_shards) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    shutil.rmtree(daemon.cache_dir)
    daemon.cache_dir.write_bytes(b"not a directory")  # mkdir there fails until it is removed
    with api(daemon) as http:
        wait_for(lambda: http.get("/v1/health").status_code == 503, "health to fail after rm -rf", 15)
        body = documented("/v1/health", "get", 503).model_validate(http.get("/v1/health").json())
    assert body.status == "failing" and str(daemon.cache_dir) in body.detail


def test_a_request_off_the_schema_answers_the_documented_body(daemon_factory, local_shards) -> None:
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with api(daemon) as http:
        refused = http.post("/v1/telemetry", json={"job": "j"})
    assert refused.status_code == 422
    body = documented("/v1/telemetry", "post", 422).model_validate(refused.json())
    assert body.error and body.detail
