"""Same URL, new content: the stale copy stops being served once revalidation sees the change; a manifest
checksum that does not match the bytes is rejected."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from harness.daemon_api import api
from harness.shards import make_tar_shard
from shardcache import Dataset, RuntimeContext
from shardcache.errors import RemoteFailed
from tests.hardening.cache_checks import published_shards


def overwrite(s3_client, bucket: str, name: str, tmp_path: Path) -> bytes:  # type: ignore[no-untyped-def]
    """Upload new content (other samples, other size) under the same key; return it."""
    path = tmp_path / f"new-{name}"
    make_tar_shard(path, 99, samples=20, payload_bytes=3000)
    s3_client.upload_file(str(path), bucket, f"shards/{name}")
    return path.read_bytes()


def test_a_changed_object_is_fetched_again_when_revalidation_is_due(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--revalidate-after-s", "0.001"])
    with api(daemon) as http:
        old = http.post("/v1/shards/open", json={"url": url}).json()
        new_bytes = overwrite(s3_client, shards.bucket, shards.names[0], tmp_path)
        new = http.post("/v1/shards/open", json={"url": url}).json()
        assert Path(old["path"]).exists(), "the stale copy went away under its reader's lease"
        http.post("/v1/shards/release", json={"lease": old["lease"]})
        listed = http.get("/v1/shards").json()["shards"]
    assert new["hit"] is False
    assert new["path"] != old["path"]
    assert Path(new["path"]).read_bytes() == new_bytes
    assert [(s["url"], s["size"]) for s in listed] == [(url, len(new_bytes))]
    assert not Path(old["path"]).exists(), "the stale copy outlived its last lease"
    assert list(published_shards(daemon.cache_dir).values()) == [Path(new["path"])]


def test_within_the_revalidation_interval_the_cached_version_is_served(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    # The documented policy (docs/reliability.md): a hit younger than --revalidate-after-s is not re-checked.
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--revalidate-after-s", "3600"])
    with api(daemon) as http:
        old = http.post("/v1/shards/open", json={"url": url}).json()
        overwrite(s3_client, shards.bucket, shards.names[0], tmp_path)
        again = http.post("/v1/shards/open", json={"url": url}).json()
    assert again["hit"] is True and again["path"] == old["path"]
    assert Path(again["path"]).read_bytes() == Path(shards.local_paths[0]).read_bytes()


def test_a_manifest_size_that_no_longer_matches_the_cached_copy_refetches(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--revalidate-after-s", "3600"])
    with api(daemon) as http:
        http.post("/v1/shards/open", json={"url": url}).raise_for_status()
        new_bytes = overwrite(s3_client, shards.bucket, shards.names[0], tmp_path)
        new = http.post("/v1/shards/open", json={"url": url, "size": len(new_bytes)}).json()
    assert Path(new["path"]).read_bytes() == new_bytes


CHECKSUM_NOT_CHECKED_ON_HITS = (
    "a resident shard is served to an open whose checksum does not match it: ShardService._still_valid "
    "compares the size only, never the checksum; and plans carry no checksums, so a planned read is "
    "prefetched unchecked and the open that brings the manifest's checksum then hits. Fix: when the request "
    "has a checksum and entry.checksum differs (or is None), hash the file in a worker thread (remember the "
    "result in entry.checksum) and raise IntegrityError on a mismatch"
)


def test_a_manifest_checksum_mismatch_fails_the_pipeline_naming_the_url(
    make_bucket, daemon_factory, tmp_path
):
    shards = make_bucket(count=2, samples=4)
    manifest = tmp_path / "manifest.jsonl"
    lines = []
    for i, (url, local) in enumerate(zip(shards.s3_urls, shards.local_paths, strict=True)):
        digest = hashlib.sha256(Path(local).read_bytes()).hexdigest()
        if i == 1:
            digest = "0" * 64  # the manifest disagrees with the bytes in the bucket
        lines.append(
            json.dumps({"url": url, "size": Path(local).stat().st_size, "checksum": f"sha256:{digest}"})
        )
    manifest.write_text("\n".join(lines) + "\n")
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    dataset = Dataset.from_source("tars", str(manifest), context=RuntimeContext(), daemon=daemon.socket)
    with pytest.raises(RemoteFailed, match="checksum") as failure:  # noqa: PT012
        list(dataset)
    assert shards.s3_urls[1] in str(failure.value)
    # Plans name the shard for this epoch and the next, so prefetches (which carry no checksum) keep
    # asking for it; warming asks too. A version that failed its manifest checksum is never published
    # again on the daemon's own initiative, whichever comes first: the open's refusal or a prefetch.
    with api(daemon) as http:
        http.post("/v1/prefetch", json={"urls": [shards.s3_urls[1]]}).raise_for_status()
        deadline = time.monotonic() + 3.0  # an absence: watched for a while, every fetch long finished
        while time.monotonic() < deadline:
            assert shards.s3_urls[1] not in published_shards(daemon.cache_dir)
            time.sleep(0.05)
        assert http.get("/v1/stats").json()["fetches_in_flight"] == 0
    assert shards.s3_urls[1] not in published_shards(daemon.cache_dir)


def test_a_checksum_mismatch_is_rejected_even_when_the_shard_is_already_cached(make_bucket, daemon_factory):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        http.post("/v1/shards/open", json={"url": url}).raise_for_status()
        wrong = http.post("/v1/shards/open", json={"url": url, "checksum": "sha256:" + "0" * 64})
    assert wrong.status_code == 502
    assert wrong.json()["error"] == "checksum_mismatch"


def test_a_manifest_checksum_mismatch_is_rejected_on_download_and_nothing_is_published(
    make_bucket, daemon_factory
):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "0"])
    with api(daemon) as http:
        wrong = http.post("/v1/shards/open", json={"url": url, "checksum": "sha256:" + "0" * 64})
    assert wrong.status_code == 502
    assert wrong.json()["error"] == "checksum_mismatch" and url in wrong.json()["detail"]
    assert published_shards(daemon.cache_dir) == {}


def test_a_restart_after_a_crash_keeps_only_the_newest_version_of_a_changed_object(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    cache = tmp_path / "crashed"
    args = ["--revalidate-after-s", "0.001"]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache, extra_args=args)
    with api(daemon) as http:
        old = http.post("/v1/shards/open", json={"url": url}).json()  # leased: the stale copy must live on
        new_bytes = overwrite(s3_client, shards.bucket, shards.names[0], tmp_path)
        new = http.post("/v1/shards/open", json={"url": url}).json()
    daemon.kill()
    again = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache, extra_args=args)
    with api(again) as http:
        stats = http.get("/v1/stats").json()
    assert stats["used"] == len(new_bytes)
    assert not Path(old["path"]).exists()
    assert Path(new["path"]).read_bytes() == new_bytes
