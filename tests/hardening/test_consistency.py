"""A job never reads a cached copy older than the remote was when the job began; within a running job
`--revalidate-after-s` bounds staleness; datasets declared immutable are never checked; a restart does not
make a copy look freshly checked. The daemon counts what it asks S3 (`shardcache_remote_requests_total`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from harness.daemon_api import api, metric
from harness.devservers import Daemon
from harness.polling import wait_for
from harness.shards import ShardSet, make_tar_shard
from shardcache import Dataset, RuntimeContext

# No prefetch: every request the daemon sends is one a test causes. One hour: longer than any test.
ARGS = ["--prefetch-depth", "0", "--revalidate-after-s", "3600"]
OPS = ("head", "get", "list")
RESULTS = ("unchanged", "changed", "missing")


def rewrite(s3_client: Any, shards: ShardSet, index: int, tmp_path: Path, samples: int = 20) -> bytes:
    """Upload other samples (another size) under shard `index`'s key; return the new bytes."""
    path = tmp_path / f"rewritten-{index}.tar"
    make_tar_shard(path, 100 + index, samples=samples, payload_bytes=3000)
    s3_client.upload_file(str(path), shards.bucket, f"shards/{shards.names[index]}")
    return path.read_bytes()


def requests(daemon: Daemon) -> dict[str, float]:
    return {op: metric(daemon, "shardcache_remote_requests_total", f'op="{op}"') for op in OPS}


def validations(daemon: Daemon) -> dict[str, float]:
    return {
        result: metric(daemon, "shardcache_validations_total", f'result="{result}"') for result in RESULTS
    }


def register(http: httpx.Client, job: str, urls: list[str], epoch: int = 0, **extra: Any) -> str:
    answer = http.post("/v1/plans", json={"job": job, "slot": 0, "epoch": epoch, "urls": urls, **extra})
    answer.raise_for_status()
    return str(answer.json()["plan"])


def read(http: httpx.Client, url: str, plan: str | None = None) -> tuple[dict[str, Any], bytes]:
    """Open `url` (under `plan`), read the file handed over, release it: (the grant, the bytes)."""
    body = {"url": url} if plan is None else {"url": url, "plan": plan}
    grant = http.post("/v1/shards/open", json=body).raise_for_status().json()
    data = Path(grant["path"]).read_bytes()
    http.post("/v1/shards/release", json={"lease": grant["lease"]}).raise_for_status()
    return grant, data


def test_a_job_that_begins_after_a_rewrite_reads_the_new_bytes(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=3, samples=4)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    with api(daemon) as http:
        first = register(http, "train", urls)
        for url in urls:
            read(http, url, first)
        http.delete(f"/v1/plans/{first}").raise_for_status()  # the job ends
        new_bytes = rewrite(s3_client, shards, 1, tmp_path)
        second = register(http, "train", urls)  # the same job id begins again
        grant, data = read(http, urls[1], second)
        untouched, _ = read(http, urls[0], second)
    assert data == new_bytes and grant["hit"] is False
    assert untouched["hit"] is True


def test_the_cached_shards_of_a_beginning_jobs_plan_are_checked_by_one_listing_not_a_head_each(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=20, samples=2)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    with api(daemon) as http:
        for url in urls:
            read(http, url)
        rewrite(s3_client, shards, 7, tmp_path)
        before = requests(daemon)
        register(http, "fresh", urls)
        wait_for(
            lambda: sum(validations(daemon).values()) >= len(urls), "the plan's 20 cached shards checked"
        )
        resident = {shard["url"] for shard in http.get("/v1/shards").json()["shards"]}
    after = requests(daemon)
    checked = validations(daemon)
    assert (checked["changed"], checked["missing"]) == (1, 0) and checked["unchanged"] >= 19
    # The one HEAD: the shard the reader opens next, checked at once rather than by its listing page.
    assert {op: after[op] - before[op] for op in OPS} == {"head": 1, "get": 0, "list": 1}
    assert resident == set(urls) - {urls[7]}, "the changed object's copy was kept"
    assert metric(daemon, "shardcache_validation_pending_shards") == 0


def test_a_copy_whose_object_is_gone_from_the_remote_is_dropped_when_a_job_begins(
    make_bucket, daemon_factory, s3_client
):
    shards = make_bucket(count=3, samples=2)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    with api(daemon) as http:
        for url in urls:
            read(http, url)
        s3_client.delete_object(Bucket=shards.bucket, Key=f"shards/{shards.names[2]}")
        register(http, "fresh", urls)
        wait_for(lambda: sum(validations(daemon).values()) >= len(urls), "the plan's cached shards checked")
        resident = {shard["url"] for shard in http.get("/v1/shards").json()["shards"]}
        missing = http.post("/v1/shards/open", json={"url": urls[2]})
    checked = validations(daemon)
    assert (checked["changed"], checked["missing"]) == (0, 1)
    assert resident == set(urls[:2])
    assert missing.status_code == 404 and urls[2] in missing.json()["detail"]


def test_within_a_running_job_the_revalidation_bound_holds(make_bucket, daemon_factory, s3_client, tmp_path):
    shards = make_bucket(count=2, samples=4)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    with api(daemon) as http:
        epoch0 = register(http, "train", urls, epoch=0)
        _, old_bytes = read(http, urls[0], epoch0)
        rewrite(s3_client, shards, 0, tmp_path)
        before = requests(daemon)
        epoch1 = register(http, "train", urls, epoch=1)  # the job's next epoch: it goes on
        grant, data = read(http, urls[0], epoch1)
    after = requests(daemon)
    assert grant["hit"] is True and data == old_bytes
    assert {op: after[op] - before[op] for op in OPS} == {"head": 0, "get": 0, "list": 0}


def test_a_plan_declared_immutable_is_served_without_asking_the_remote(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=2, samples=4)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    with api(daemon) as http:
        _, old_bytes = read(http, urls[0])
        rewrite(s3_client, shards, 0, tmp_path)
        before = requests(daemon)
        plan = register(http, "frozen", urls, immutable=True)
        grant, data = read(http, urls[0], plan)
    after = requests(daemon)
    assert grant["hit"] is True and data == old_bytes
    assert {op: after[op] - before[op] for op in OPS} == {"head": 0, "get": 0, "list": 0}
    assert validations(daemon) == dict.fromkeys(RESULTS, 0.0)


def test_a_prefix_the_operator_declares_immutable_is_never_checked(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=2, samples=4)
    urls = shards.s3_urls
    # Without --immutable, a bound this short would check the copy on every open.
    args = ["--prefetch-depth", "0", "--revalidate-after-s", "0.001", "--immutable", f"s3://{shards.bucket}"]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=args)
    with api(daemon) as http:
        _, old_bytes = read(http, urls[0])
        rewrite(s3_client, shards, 0, tmp_path)
        before = requests(daemon)
        plan = register(http, "fresh", urls)
        with_plan, data = read(http, urls[0], plan)
        without_plan, _ = read(http, urls[0])
    after = requests(daemon)
    assert with_plan["hit"] is True and without_plan["hit"] is True and data == old_bytes
    assert {op: after[op] - before[op] for op in OPS} == {"head": 0, "get": 0, "list": 0}


def test_a_copy_recovered_after_a_restart_is_checked_before_it_is_served(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=1, samples=4)
    url = shards.s3_urls[0]
    cache = tmp_path / "kept"
    # A bound longer than any uptime: a copy validated "at 0" on the monotonic clock (seconds since boot),
    # as recovered copies were, would still look fresh after the restart.
    args = ["--prefetch-depth", "0", "--revalidate-after-s", "1000000000"]
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache, extra_args=args)
    with api(daemon) as http:
        read(http, url)
    daemon.stop()
    new_bytes = rewrite(s3_client, shards, 0, tmp_path)
    again = daemon_factory(allow=[f"s3://{shards.bucket}"], cache_dir=cache, extra_args=args)
    with api(again) as http:
        grant, data = read(http, url)
        second, _ = read(http, url)
    assert grant["hit"] is False and data == new_bytes
    assert second["hit"] is True  # checked once; from then on the bound counts from that check


TRAINER = textwrap.dedent(
    """
    import sys
    from shardcache import Dataset

    print(sum(1 for _ in Dataset.from_source("tars", sys.argv[2:], daemon=sys.argv[1])))
    """
)


def run_trainer(daemon: Daemon, urls: list[str]) -> int:
    """Samples one run of a trainer script reads through the daemon, under its default job id."""
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, daemon.socket, *urls], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


def test_a_trainer_run_after_a_rewrite_reads_the_new_samples(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=3, samples=8)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--revalidate-after-s", "3600"])
    assert run_trainer(daemon, urls) == 24
    rewrite(s3_client, shards, 2, tmp_path, samples=11)
    # The same script again: the same default job id, whose plans the first run left behind.
    assert run_trainer(daemon, urls) == 27


def test_a_dataset_declared_immutable_reads_the_cached_copies_without_asking_the_remote(
    make_bucket, daemon_factory, s3_client, tmp_path
):
    shards = make_bucket(count=3, samples=8)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=ARGS)
    context = RuntimeContext()
    first = Dataset.from_source("tars", urls, context=context, daemon=daemon.socket, job="first")
    assert sum(1 for _ in first) == 24
    rewrite(s3_client, shards, 2, tmp_path, samples=11)
    before = requests(daemon)
    frozen = Dataset.from_source(
        "tars", urls, context=context, daemon=daemon.socket, job="second", immutable=True
    )
    assert sum(1 for _ in frozen) == 24
    after = requests(daemon)
    assert {op: after[op] - before[op] for op in OPS} == {"head": 0, "get": 0, "list": 0}
