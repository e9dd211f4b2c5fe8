"""Plans through the real daemon on its Unix socket, with shards in a real S3 endpoint (moto's server)."""

from __future__ import annotations

from functools import partial

import httpx
import pytest

from harness.daemon_api import api, metric
from harness.polling import wait_for


def open_and_release(http: httpx.Client, url: str, plan: str | None = None) -> bool:
    """One client open (with its plan id) and release; returns whether it was a hit."""
    answer = http.post("/v1/shards/open", json={"url": url, "plan": plan})
    answer.raise_for_status()
    http.post("/v1/shards/release", json={"lease": answer.json()["lease"]}).raise_for_status()
    return bool(answer.json()["hit"])


def resident(http: httpx.Client) -> dict[str, float | None]:
    """url -> next use of every resident shard."""
    return {s["url"]: s["next_use"] for s in http.get("/v1/shards").json()["shards"]}


def settled(http: httpx.Client, count: int) -> bool:
    stats: dict[str, int] = http.get("/v1/stats").json()
    return stats["fetches_in_flight"] == 0 and stats["resident_shards"] >= count


def test_a_plan_is_registered_counted_and_deleted(make_bucket, daemon_factory):
    shards = make_bucket(count=2)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "0"])
    with api(daemon) as http:
        plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": shards.s3_urls}).json()
        assert http.get("/v1/stats").json()["plans"] == 1
        assert metric(daemon, "shardcache_plans") == 1
        assert http.delete(f"/v1/plans/{plan['plan']}").status_code == 204
        assert http.delete(f"/v1/plans/{plan['plan']}").status_code == 404
        assert http.get("/v1/stats").json()["plans"] == 0


def test_a_plan_outside_the_allow_list_is_refused(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        answer = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": ["s3://other/x.tar"]}
        )
    assert answer.status_code == 403


def test_a_registered_plan_warms_its_first_shards_up_to_the_depth(make_bucket, daemon_factory):
    shards = make_bucket(count=5)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "2"])
    urls = shards.s3_urls
    with api(daemon) as http:
        http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls}).raise_for_status()
        wait_for(lambda: settled(http, 2), "the first two planned shards to be prefetched")
        assert resident(http) == {urls[0]: 1.0, urls[1]: 2.0}


def test_opens_under_the_plan_hit_prefetched_shards_and_count_them_used(make_bucket, daemon_factory):
    shards = make_bucket(count=5)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "2"])
    urls = shards.s3_urls
    with api(daemon) as http:
        plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls}).json()["plan"]
        hits = []
        for i, url in enumerate(urls):
            wait_for(partial(settled, http, min(i + 2, len(urls))), f"prefetch ahead of shard {i}")
            hits.append(open_and_release(http, url, plan))
        assert hits == [True] * len(urls)
        assert resident(http)[urls[0]] is None  # passed by the cursor, in no plan ahead
    assert metric(daemon, "shardcache_prefetched_shards_total", 'outcome="used"') == len(urls)


def test_next_use_reaches_into_the_next_epochs_plan(make_bucket, daemon_factory):
    shards = make_bucket(count=3)
    a, b, c = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "0"])
    with api(daemon) as http:
        for url in (a, b, c):
            open_and_release(http, url)  # resident, opened under no plan: no pace is known yet
        now = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": [b, c]}).json()["plan"]
        http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 1, "urls": [c, a]}).raise_for_status()
        # Before any open under the plans the slot's time line starts at the moment of asking, at the default
        # pace of one open per second, so the distances are exact whatever the machine's speed: b is the next
        # open, c the second, and a comes only in the next epoch, after b, c and that epoch's c.
        assert resident(http) == {b: pytest.approx(1.0), c: pytest.approx(2.0), a: pytest.approx(4.0)}
        open_and_release(http, b, now)
        # The open moved the cursor: a is one open nearer (less the time since that open, which the
        # rate-scaled distance subtracts, so only relations that hold at any speed are asserted).
        after = resident(http)
    a_next, c_next = after[a], after[c]
    assert a_next is not None and c_next is not None
    assert a_next <= 3.0 and a_next >= c_next


def test_belady_evicts_the_shard_used_farthest_ahead_where_lru_evicts_the_oldest(
    make_bucket, daemon_factory, tmp_path
):
    shards = make_bucket(count=4)
    a, b, c, d = shards.s3_urls
    capacity = f"{3 * shards.size_of(shards.names[0]) + 100}B"
    order = [a, b, c, d, a, b]
    kept = {}
    for policy in ("belady", "lru"):
        daemon = daemon_factory(
            allow=[f"s3://{shards.bucket}"],
            capacity=capacity,
            extra_args=["--policy", policy, "--prefetch-depth", "0"],
            cache_dir=tmp_path / f"cache-{policy}",
        )
        with api(daemon) as http:
            plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": order}).json()[
                "plan"
            ]
            for url in order[:4]:
                open_and_release(http, url, plan)
            kept[policy] = set(resident(http))
    assert kept["belady"] == {a, b, d}  # c is used farthest ahead (never again)
    assert kept["lru"] == {b, c, d}  # a is the least recent


def test_lru_policy_never_prefetches(make_bucket, daemon_factory):
    shards = make_bucket(count=3)
    urls = shards.s3_urls
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--policy", "lru"])
    with api(daemon) as http:
        plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls}).json()["plan"]
        assert open_and_release(http, urls[0], plan) is False
        assert settled(http, 1)
        assert set(resident(http)) == {urls[0]}
        assert open_and_release(http, urls[1], plan) is False
    assert metric(daemon, "shardcache_prefetched_shards_total", 'outcome="used"') == 0


def test_a_plan_without_opens_goes_stale_and_is_dropped(make_bucket, daemon_factory):
    shards = make_bucket(count=2)
    daemon = daemon_factory(
        allow=[f"s3://{shards.bucket}"], extra_args=["--plan-stale-s", "1", "--prefetch-depth", "0"]
    )
    with api(daemon) as http:
        plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": shards.s3_urls}).json()
        wait_for(lambda: http.get("/v1/stats").json()["plans"] == 0, "the idle plan to be dropped")
        assert http.delete(f"/v1/plans/{plan['plan']}").status_code == 404
    assert metric(daemon, "shardcache_plans") == 0
