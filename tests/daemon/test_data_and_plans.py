"""Streaming with Range, plans driving prefetch, explicit warming and the resident listing."""

from __future__ import annotations

from pathlib import Path

from harness.daemon_api import api, metric
from harness.polling import wait_for


def test_data_streams_the_whole_shard_with_content_length(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    expected = Path(shards.local_paths[0]).read_bytes()
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        answer = http.get("/v1/shards/data", params={"url": shards.s3_urls[0]})
    assert answer.status_code == 200
    assert answer.content == expected
    assert int(answer.headers["content-length"]) == len(expected)
    assert metric(daemon, "shardcache_served_bytes_total", 'mode="stream"') == len(expected)


def test_data_answers_range_requests_with_206(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    expected = Path(shards.local_paths[0]).read_bytes()
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        middle = http.get(
            "/v1/shards/data", params={"url": shards.s3_urls[0]}, headers={"Range": "bytes=100-611"}
        )
        tail = http.get("/v1/shards/data", params={"url": shards.s3_urls[0]}, headers={"Range": "bytes=-10"})
        beyond = http.get(
            "/v1/shards/data",
            params={"url": shards.s3_urls[0]},
            headers={"Range": f"bytes={len(expected) + 5}-"},
        )
    assert (middle.status_code, middle.content) == (206, expected[100:612])
    assert middle.headers["content-range"] == f"bytes 100-611/{len(expected)}"
    assert tail.content == expected[-10:]
    assert beyond.status_code == 416


def test_data_of_a_url_outside_the_allow_list_is_403(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/elsewhere"])
    with api(daemon) as http:
        assert http.get("/v1/shards/data", params={"url": shards.s3_urls[0]}).status_code == 403


def test_plans_are_registered_listed_and_deleted(make_bucket, daemon_factory):
    shards = make_bucket(count=2)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "0"])
    with api(daemon) as http:
        plan = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": shards.s3_urls}
        ).json()["plan"]
        during = http.get("/v1/stats").json()["plans"]
        deleted = http.delete(f"/v1/plans/{plan}")
        again = http.delete(f"/v1/plans/{plan}")
        after = http.get("/v1/stats").json()["plans"]
    assert (during, after) == (1, 0)
    assert (deleted.status_code, again.status_code) == (204, 404)


def test_a_plan_makes_the_daemon_prefetch_the_next_shards(make_bucket, daemon_factory):
    shards = make_bucket(count=4)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--prefetch-depth", "2"])
    with api(daemon) as http:
        plan = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": shards.s3_urls}
        ).json()["plan"]
        wait_for(lambda: http.get("/v1/stats").json()["resident_shards"] == 2, "two shards prefetched")
        first = http.post("/v1/shards/open", json={"url": shards.s3_urls[0], "plan": plan}).json()
        wait_for(
            lambda: http.get("/v1/stats").json()["resident_shards"] == 3, "the cursor to move the window"
        )
        listed = {s["url"]: s for s in http.get("/v1/shards").json()["shards"]}
    assert first["hit"] is True
    assert set(listed) == set(shards.s3_urls[:3])
    assert listed[shards.s3_urls[0]]["next_use"] is None
    assert listed[shards.s3_urls[2]]["next_use"] is not None
    assert metric(daemon, "shardcache_prefetched_shards_total", 'outcome="used"') == 1


def test_lru_policy_does_not_prefetch(make_bucket, daemon_factory):
    shards = make_bucket(count=3)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"], extra_args=["--policy", "lru"])
    with api(daemon) as http:
        plan = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": shards.s3_urls}
        ).json()["plan"]
        answer = http.post("/v1/shards/open", json={"url": shards.s3_urls[0], "plan": plan}).json()
        stats = http.get("/v1/stats").json()
    assert answer["hit"] is False
    assert (stats["resident_shards"], stats["policy"]) == (1, "lru")


def test_prefetch_warms_shards_in_the_background(make_bucket, daemon_factory):
    shards = make_bucket(count=3)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}"])
    with api(daemon) as http:
        accepted = http.post("/v1/prefetch", json={"urls": shards.s3_urls})
        wait_for(lambda: http.get("/v1/stats").json()["resident_shards"] == 3, "three shards warmed")
        hits = [http.post("/v1/shards/open", json={"url": url}).json()["hit"] for url in shards.s3_urls]
    assert accepted.status_code == 202
    assert hits == [True, True, True]


def test_prefetch_outside_the_allow_list_is_403(make_bucket, daemon_factory):
    shards = make_bucket(count=1)
    daemon = daemon_factory(allow=[f"s3://{shards.bucket}/nothing"])
    with api(daemon) as http:
        assert http.post("/v1/prefetch", json={"urls": shards.s3_urls}).status_code == 403
