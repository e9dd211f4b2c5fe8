"""How opens, warming and eviction drive the planner, through the real daemon and a real S3 endpoint."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from harness.daemon_api import api, metric
from harness.devservers import S3Server
from harness.polling import wait_for
from tests.daemon.daemon_helpers import Proxy


def stats(http: httpx.Client) -> dict[str, object]:
    return dict(http.get("/v1/stats").json())


def resident(http: httpx.Client) -> set[str]:
    return {s["url"] for s in http.get("/v1/shards").json()["shards"]}


def settled(http: httpx.Client, count: int) -> bool:
    now = stats(http)
    return now["fetches_in_flight"] == 0 and now["resident_shards"] == count


def add_plan(http: httpx.Client, urls: list[str]) -> str:
    answer = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls})
    answer.raise_for_status()
    return str(answer.json()["plan"])


def shard_size(shards: object) -> int:
    sizes = {Path(p).stat().st_size for p in shards.local_paths}  # type: ignore[attr-defined]
    assert len(sizes) == 1, "the tests size the cache in whole shards"
    return sizes.pop()


def test_an_open_waiting_on_a_miss_already_moves_its_plans_prefetch_window(
    make_bucket, daemon_factory, s3_server: S3Server
):
    shards = make_bucket(count=4, samples=4, payload_bytes=64 * 1024)
    a, b, _, _ = urls = shards.s3_urls
    with Proxy(s3_server.endpoint, rate=256 * 1024) as slow:  # about one second per shard
        daemon = daemon_factory(
            allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "1"], env=slow.env
        )
        with api(daemon) as http, api(daemon) as watcher:
            plan = add_plan(http, urls)  # prefetches a (depth 1)
            opened = threading.Event()

            def open_a() -> None:
                http.post("/v1/shards/open", json={"url": a, "plan": plan}).raise_for_status()
                opened.set()

            reader = threading.Thread(target=open_a)
            reader.start()
            seen: list[bool] = []

            def b_fetching_or_a_opened() -> bool:
                if opened.is_set():
                    seen.append(False)
                    return True
                fetching = stats(watcher)["fetches_in_flight"] == 2
                if fetching and not opened.is_set():
                    seen.append(True)
                return fetching

            wait_for(b_fetching_or_a_opened, "b's prefetch or a's open")
            reader.join(60)
            wait_for(lambda: settled(watcher, 2), "b to arrive")
            assert resident(watcher) == {a, b}
    assert seen == [True], "b was not prefetched while the open of a waited for its download"


def test_warming_an_unplanned_url_into_a_cache_full_of_planned_shards_is_skipped(
    make_bucket, daemon_factory, tmp_path: Path
):
    shards = make_bucket(count=3)
    a, b, x = shards.s3_urls
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity=f"{2 * shard_size(shards)}B",
        extra_args=["--prefetch-depth", "2"],
    )
    log = tmp_path / "daemon0.log"
    with api(daemon) as http:
        add_plan(http, [a, b])
        wait_for(lambda: settled(http, 2), "the plan's shards to be prefetched")
        assert http.post("/v1/prefetch", json={"urls": [x]}).status_code == 202
        wait_for(lambda: f"not warming {x}" in log.read_text(), "the warm to give up")
        assert resident(http) == {a, b}
    assert metric(daemon, "shardcache_evictions_total", 'reason="prefetch"') == 0


def test_warming_displaces_shards_that_no_plan_needs(make_bucket, daemon_factory):
    shards = make_bucket(count=4)
    a, b, x, y = shards.s3_urls
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity=f"{3 * shard_size(shards)}B",
        extra_args=["--prefetch-depth", "2", "--max-fetches", "1"],
    )
    with api(daemon) as http:
        add_plan(http, [a, b])
        wait_for(lambda: settled(http, 2), "the plan's shards to be prefetched")
        assert http.post("/v1/prefetch", json={"urls": [x, y]}).status_code == 202
        # x fills the free space; y displaces x (in no plan), never a or b.
        wait_for(lambda: y in resident(http) and settled(http, 3), "the warm to finish")
        assert resident(http) == {a, b, y}
    assert metric(daemon, "shardcache_evictions_total", 'reason="prefetch"') == 1


def test_a_prefetched_shard_evicted_before_any_open_counts_as_evicted_unused(make_bucket, daemon_factory):
    shards = make_bucket(count=3)
    a, b, c = shards.s3_urls
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"],
        capacity=f"{2 * shard_size(shards)}B",
        extra_args=["--prefetch-depth", "2"],
    )
    with api(daemon) as http:
        add_plan(http, [a, b])
        wait_for(lambda: settled(http, 2), "the plan's shards to be prefetched")
        answer = http.post("/v1/shards/open", json={"url": c})  # no plan: a demand miss evicts b, used last
        http.post("/v1/shards/release", json={"lease": answer.json()["lease"]}).raise_for_status()
        assert resident(http) == {a, c}
    assert metric(daemon, "shardcache_prefetched_shards_total", 'outcome="evicted_unused"') == 1
    assert metric(daemon, "shardcache_prefetched_shards_total", 'outcome="used"') == 0
