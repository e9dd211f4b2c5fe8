"""A flaky remote between the daemon and S3: the trainer sees exactly the clean run, and nothing partial."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from harness.daemon_api import api, metric
from shardcache import Dataset, RuntimeContext
from shardcache.errors import RemoteFailed
from tests.hardening.cache_checks import assert_cache_intact
from tests.hardening.faultproxy import proxy_env

FAST_RETRIES = [
    "--retries",
    "4",
    "--retry-backoff-s",
    "0.01",
    "--connect-timeout-s",
    "2",
    "--read-timeout-s",
    "1",
]
# Per shard, the faults its first download attempts meet (at most 4 in a row: the daemon retries 4 times).
FAULT_PLAN = [
    ["503", "503", "503"],  # a 5xx burst
    ["reset"],
    ["truncate"],
    ["stall"],
    ["trickle"],
    ["500", "reset", "truncate", "503"],
    ["truncate", "trickle"],
    ["reset", "reset"],
]


def samples(dataset: Dataset, epochs: int = 2) -> list[tuple[str, str]]:
    """(key, sha1 of the payload) of every sample of `epochs` epochs, in order."""
    seen = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        seen += [(s["__key__"], hashlib.sha1(s["bin"]).hexdigest()) for s in dataset]
    return seen


def tars(urls: list[str], daemon: Any) -> Dataset:
    return Dataset.from_source("tars", urls, context=RuntimeContext(seed=7), daemon=daemon).shuffle(16)


def schedule(proxy: Any, bucket: str, names: list[str]) -> int:
    injected = 0
    for name, faults in zip(names, FAULT_PLAN, strict=False):
        proxy.schedule(f"{bucket}/shards/{name}", faults)
        injected += sum(f != "trickle" for f in faults)
    return injected


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_epochs_through_faults_yield_the_clean_runs_samples(make_bucket, daemon_factory, fault_proxy):
    shards = make_bucket(count=8, samples=16, payload_bytes=4096)
    clean = samples(tars(shards.s3_urls, daemon=None))

    proxy = fault_proxy()
    failing = schedule(proxy, shards.bucket, shards.names)
    # Half the dataset fits: the second epoch downloads again, through the faults scheduled next.
    capacity = f"{shards.total_bytes // 2}B"
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"], capacity=capacity, extra_args=FAST_RETRIES, env=proxy_env(proxy)
    )
    dataset = tars(shards.s3_urls, daemon=daemon.socket)
    dataset.set_epoch(0)
    first = [(s["__key__"], hashlib.sha1(s["bin"]).hexdigest()) for s in dataset]
    assert proxy.pending() == 0
    failing += schedule(proxy, shards.bucket, list(reversed(shards.names)))
    dataset.set_epoch(1)
    second = [(s["__key__"], hashlib.sha1(s["bin"]).hexdigest()) for s in dataset]

    assert first + second == clean
    originals = dict(zip(shards.s3_urls, map(Path, shards.local_paths), strict=True))
    assert assert_cache_intact(daemon.cache_dir, originals) > 0
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="transient"') > 0
    assert sum(proxy.counters.faults.values()) >= failing - proxy.pending()
    assert daemon.process.poll() is None
    transient = metric(daemon, "shardcache_fetch_errors_total", 'kind="transient"')
    print(
        f"\nflaky remote: {len(clean)} samples identical to the clean run; faults injected "
        f"{dict(proxy.counters.faults)}; shardcache_fetch_errors_total{{kind=transient}} {transient:.0f}"
    )


@pytest.mark.timeout(60)
def test_every_fault_kind_is_retried_and_the_shard_published_whole(make_bucket, daemon_factory, fault_proxy):
    shards = make_bucket(count=5, samples=8, payload_bytes=8192)
    proxy = fault_proxy()
    kinds = ["503", "reset", "truncate", "stall", "500"]
    for name, kind in zip(shards.names, kinds, strict=True):
        proxy.schedule(f"{shards.bucket}/shards/{name}", [kind])
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=FAST_RETRIES, env=proxy_env(proxy))
    with api(daemon) as http:
        answers = [http.post("/v1/shards/open", json={"url": url}) for url in shards.s3_urls]
    assert [a.status_code for a in answers] == [200] * 5
    for answer, local in zip(answers, shards.local_paths, strict=True):
        assert Path(answer.json()["path"]).read_bytes() == Path(local).read_bytes()
    assert dict(proxy.counters.faults) == dict.fromkeys(kinds, 1)
    assert (
        assert_cache_intact(
            daemon.cache_dir, dict(zip(shards.s3_urls, map(Path, shards.local_paths), strict=True))
        )
        == 5
    )


BOTOCORE_RETRIES = (
    "the daemon passes botocore retries={'max_attempts': 1}, which botocore reads as ONE RETRY (max_attempts "
    "counts retries; total_max_attempts counts attempts): every transient error is retried once inside "
    "botocore, invisible to shardcache_fetch_errors_total, with botocore's own backoff. Fix: "
    "{'total_max_attempts': 1, 'mode': 'standard'}"
)


@pytest.mark.timeout(60)
def test_each_failed_attempt_is_counted_and_retried_only_by_the_daemons_policy(
    make_bucket, daemon_factory, fault_proxy
):
    shards = make_bucket(count=3, samples=8, payload_bytes=8192)
    proxy = fault_proxy()
    for name, kind in zip(shards.names, ["503", "500", "stall"], strict=True):
        proxy.schedule(f"{shards.bucket}/shards/{name}", [kind])
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=FAST_RETRIES, env=proxy_env(proxy))
    with api(daemon) as http:
        for url in shards.s3_urls:
            http.post("/v1/shards/open", json={"url": url}).raise_for_status()
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="transient"') == 3


@pytest.mark.timeout(60)
def test_a_permanently_failing_object_fails_the_trainer_naming_its_url(
    make_bucket, daemon_factory, fault_proxy
):
    shards = make_bucket(count=2, samples=4)
    proxy = fault_proxy()
    broken = shards.names[1]
    proxy.always("503", lambda key: key.endswith(broken))
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        extra_args=["--retries", "2", "--retry-backoff-s", "0.01"],
        env=proxy_env(proxy),
    )
    dataset = Dataset.from_source("tars", shards.s3_urls, context=RuntimeContext(), daemon=daemon.socket)
    with pytest.raises(RemoteFailed) as failure:
        list(dataset)
    assert f"s3://{shards.bucket}/shards/{broken}" in str(failure.value)
    assert "3 attempts" in str(failure.value)
    assert not list(daemon.cache_dir.glob(".tmp-*"))


@pytest.mark.timeout(60)
def test_a_stalled_remote_fails_after_the_retries_instead_of_hanging(
    make_bucket, daemon_factory, fault_proxy
):
    shards = make_bucket(count=1, samples=4)
    proxy = fault_proxy(stall_s=30)
    proxy.always("stall", lambda key: True)
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        extra_args=["--retries", "1", "--retry-backoff-s", "0.01", "--read-timeout-s", "0.5"],
        env=proxy_env(proxy),
    )
    with api(daemon) as http:
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0]})
    assert answer.status_code == 502
    assert shards.s3_urls[0] in answer.json()["detail"]
    assert metric(daemon, "shardcache_fetch_errors_total", 'kind="transient"') == 2
