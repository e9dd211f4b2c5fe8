"""Lance datasets on an S3-compatible endpoint over http: storage options from the AWS environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardcache import Dataset
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import ConfigError
from shardcache.sources.lance.access import aws_storage_options, storage_options_for

ROWS = 50


@pytest.fixture
def remote_lance(s3_client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:  # type: ignore[no-untyped-def]
    """A Lance dataset uploaded to the session's moto S3 (plain http); AWS_ALLOW_HTTP is not set."""
    lance = pytest.importorskip("lance")
    pa = pytest.importorskip("pyarrow")
    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    local = tmp_path / "table.lance"
    lance.write_dataset(pa.table({"id": list(range(ROWS)), "text": [f"row {i}" for i in range(ROWS)]}), local)
    bucket = f"lance-{tmp_path.name.lower().replace('_', '-')}"[:63]
    s3_client.create_bucket(Bucket=bucket)
    for path in local.rglob("*"):
        if path.is_file():
            s3_client.upload_file(str(path), bucket, f"table.lance/{path.relative_to(local)}")
    return f"s3://{bucket}/table.lance"


def test_a_lance_dataset_on_an_http_endpoint_is_read_with_the_aws_environment(remote_lance: str) -> None:
    rows = list(Dataset.from_source("lance", remote_lance, daemon=None))
    assert sorted(row["id"] for row in rows) == list(range(ROWS))


def test_storage_options_reach_a_dataset_outside_the_environment(  # type: ignore[no-untyped-def]
    remote_lance: str, s3_server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    options = {"aws_endpoint": s3_server.endpoint, "allow_http": "true"}
    ds = Dataset.from_source("lance", remote_lance, daemon=None, storage_options=options, columns=["id"])
    assert sorted(row["id"] for row in ds) == list(range(ROWS))


def test_given_storage_options_win_over_the_derived_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://minio:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    options = storage_options_for("s3://bucket/t.lance", {"aws_region": "us-east-2"})
    assert options is not None
    assert options["aws_region"] == "us-east-2" and options["aws_endpoint"] == "http://minio:9000"
    assert storage_options_for("/data/t.lance", None) is None


def test_storage_options_do_not_change_the_fingerprint(remote_lance: str) -> None:
    plain = Dataset.from_source("lance", remote_lance, daemon=None)
    with_keys = Dataset.from_source("lance", remote_lance, daemon=None, storage_options={"aws_region": "x"})
    assert plain.fingerprint() == with_keys.fingerprint()


def test_storage_options_must_be_a_dict_of_strings() -> None:
    with pytest.raises(ConfigError, match="storage_options"):
        Dataset.from_source("lance", "s3://bucket/t.lance", storage_options={"allow_http": True})


@pytest.mark.parametrize("daemon", ["required", DaemonClient("/tmp/none.sock", required=True)])
def test_a_required_daemon_is_refused_for_lance(daemon: str | DaemonClient) -> None:
    with pytest.raises(ConfigError, match='daemon="required".*lance.*storage_options'):
        Dataset.from_source("lance", "s3://bucket/t.lance", daemon=daemon)


def test_aws_storage_options_follow_the_client_environment() -> None:
    env = {
        "AWS_ENDPOINT_URL": "http://generic:1",
        "AWS_ENDPOINT_URL_S3": "http://minio:9000",
        "AWS_DEFAULT_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
    }
    assert aws_storage_options(env) == {
        "aws_endpoint": "http://minio:9000",
        "allow_http": "true",
        "aws_region": "eu-west-1",
        "aws_access_key_id": "key",
        "aws_secret_access_key": "secret",
    }
    assert "allow_http" not in aws_storage_options({"AWS_ENDPOINT_URL": "https://s3.example.com"})
