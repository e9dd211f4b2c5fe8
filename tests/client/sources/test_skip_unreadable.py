"""`on_error="skip"`: a shard that fails for good is skipped, logged once and counted; the default raises."""

from __future__ import annotations

import logging

import pytest

from harness.start_methods import worker_context
from shardcache import Dataset, RuntimeContext, TorchLoader
from shardcache.daemon_access.daemon_client import DaemonClient
from shardcache.errors import ConfigError, RemoteNotFound

SAMPLES = 4


@pytest.fixture
def bucket_missing_one(make_bucket, s3_client):  # type: ignore[no-untyped-def]
    """Four shards in a real S3 bucket, of which the third no longer exists."""
    shards = make_bucket(count=4, samples=SAMPLES, payload_bytes=128)
    s3_client.delete_object(Bucket=shards.bucket, Key="shards/shard_000002.tar")
    return shards


def test_a_missing_object_raises_an_error_naming_its_url_by_default(
    bucket_missing_one, daemon_factory
) -> None:  # type: ignore[no-untyped-def]
    daemon = daemon_factory(allow=[f"s3://{bucket_missing_one.bucket}/"])
    ds = Dataset.from_source(
        "tars", bucket_missing_one.s3_urls, daemon=DaemonClient(str(daemon.socket), required=True)
    )
    with pytest.raises(RemoteNotFound, match="shard_000002.tar"):
        list(ds.iter_context(RuntimeContext()))


def test_on_error_skip_skips_a_missing_object_logs_it_once_and_counts_it(  # type: ignore[no-untyped-def]
    bucket_missing_one, daemon_factory, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = daemon_factory(allow=[f"s3://{bucket_missing_one.bucket}/"])
    client = DaemonClient(str(daemon.socket), required=True)
    ds = Dataset.from_source("tars", bucket_missing_one.s3_urls, daemon=client, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="shardcache"):
        it = ds.iter_context(RuntimeContext())
        got = [sample["__key__"] for sample in it]
    assert len(got) == 3 * SAMPLES
    assert not [key for key in got if key.startswith("s0002_")]
    assert it.skipped_shards == 1
    assert ds.state_dict()["end"]["skipped_shards"] == 1  # the pass ended: its position is under "end"
    warnings = [r.getMessage() for r in caplog.records if "unreadable shard" in r.getMessage()]
    assert len(warnings) == 1 and "shard_000002.tar" in warnings[0]


def test_skips_in_dataloader_workers_reach_the_main_process(
    bucket_missing_one, daemon_factory, start_method
) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    daemon = daemon_factory(allow=[f"s3://{bucket_missing_one.bucket}/"])
    ds = Dataset.from_source(
        "tars",
        bucket_missing_one.s3_urls,
        daemon=str(daemon.socket),
        on_error="skip",
        context=RuntimeContext(),
    )
    loader = TorchLoader(ds, num_workers=2, multiprocessing_context=worker_context(start_method))
    it = iter(loader)
    assert len(list(it)) == 3 * SAMPLES
    assert it.skipped_shards == 1


def test_on_error_accepts_only_raise_or_skip(local_shards) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="on_error='ignore'"):
        Dataset.from_source("tars", local_shards.local_paths, on_error="ignore")


def test_on_error_skip_also_skips_a_local_file_gone_when_read_directly(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None, on_error="skip")
    (local_shards.local_dir / local_shards.names[1]).unlink()
    it = ds.iter_context(RuntimeContext())
    assert len(list(it)) == 3 * 8
    assert it.skipped_shards == 1
