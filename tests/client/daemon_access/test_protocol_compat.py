"""The wire contract across versions: answers tolerate new fields, requests refuse unknown ones."""

from __future__ import annotations

import pydantic
import pytest

from shardcache_protocol import (
    ErrorBody,
    Health,
    OpenGrant,
    OpenRequest,
    PlanRequest,
    SessionGrant,
    SessionRequest,
    Stats,
)


def test_an_answer_from_a_newer_daemon_with_an_extra_field_still_parses() -> None:
    grant = OpenGrant.model_validate_json(
        b'{"url": "s3://b/a.tar", "path": "/c/a", "size": 3, "lease": "l1", "hit": true, "tier": "nvme"}'
    )
    assert (grant.path, grant.lease) == ("/c/a", "l1")
    assert Health.model_validate({"status": "ok", "version": "9.9", "boot_id": "x"}).version == "9.9"
    assert ErrorBody.model_validate({"error": "e", "detail": "d", "retry_after": 1}).error == "e"


def test_every_answer_model_ignores_unknown_fields() -> None:
    for model in (OpenGrant, Health, Stats, ErrorBody, SessionGrant):
        assert model.model_config.get("extra") == "ignore", model


def test_a_request_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="plna"):
        OpenRequest.model_validate({"url": "s3://b/a.tar", "plna": "p1"})


def test_requests_from_a_client_without_sessions_still_validate() -> None:
    # An older client names no session: the daemon follows its process by pid, as before sessions.
    assert OpenRequest.model_validate({"url": "s3://b/a.tar", "plan": "p1"}).session is None
    plan = {"job": "j", "slot": 0, "epoch": 0, "urls": ["s3://b/a.tar"]}
    assert PlanRequest.model_validate(plan).session is None
    assert SessionRequest.model_validate({}) == SessionRequest()


def test_a_session_grant_from_a_newer_daemon_with_an_extra_field_still_parses() -> None:
    grant = SessionGrant.model_validate_json(b'{"session": "ab12", "job": "pid 1 on t", "heartbeat_s": 5}')
    assert (grant.session, grant.job) == ("ab12", "pid 1 on t")


def test_a_session_request_with_an_unknown_field_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="hots"):
        SessionRequest.model_validate({"pid": 7, "hots": "trainer-0"})
    with pytest.raises(pydantic.ValidationError, match="session"):
        OpenRequest.model_validate({"url": "s3://b/a.tar", "session": "not a session id"})
