"""The wire contract across versions: answers tolerate new fields, requests refuse unknown ones."""

from __future__ import annotations

import pydantic
import pytest

from shardcache_protocol import ErrorBody, Health, OpenGrant, OpenRequest, Stats


def test_an_answer_from_a_newer_daemon_with_an_extra_field_still_parses() -> None:
    grant = OpenGrant.model_validate_json(
        b'{"url": "s3://b/a.tar", "path": "/c/a", "size": 3, "lease": "l1", "hit": true, "tier": "nvme"}'
    )
    assert (grant.path, grant.lease) == ("/c/a", "l1")
    assert Health.model_validate({"status": "ok", "version": "9.9", "boot_id": "x"}).version == "9.9"
    assert ErrorBody.model_validate({"error": "e", "detail": "d", "retry_after": 1}).error == "e"


def test_every_answer_model_ignores_unknown_fields() -> None:
    for model in (OpenGrant, Health, Stats, ErrorBody):
        assert model.model_config.get("extra") == "ignore", model


def test_a_request_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="plna"):
        OpenRequest.model_validate({"url": "s3://b/a.tar", "plna": "p1"})
