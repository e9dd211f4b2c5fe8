"""Shard lists by digest: a job uploads its shard list once and its plans name positions in it."""

from __future__ import annotations

import base64
import hashlib
import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.daemon_api import api
from harness.polling import wait_for
from harness.shards import ShardSet
from shardcached.errors import NotAllowed, PlanTooLarge
from shardcached.keys import AllowList
from shardcached.planning import PlanArrays, ShardListIds, ShardLists, UrlTable, read_shardlist


def blob(urls: list[str]) -> bytes:
    return "\n".join(urls).encode()


def digest_of(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def positions(values: list[int]) -> str:
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode()


# -- through the real daemon ----------------------------------------------------------------------------


def test_a_plan_over_an_uploaded_shard_list_prefetches_the_shards_at_its_positions(
    daemon_factory, local_shards: ShardSet
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--prefetch-depth", "2"])
    urls = local_shards.local_paths
    body = blob(urls)
    with api(daemon) as http:
        put = http.put(f"/v1/shardlists/{digest_of(body)}", content=body)
        assert put.status_code == 200 and put.json() == {"shardlist": digest_of(body), "urls": 4}
        plan = {
            "job": "j",
            "slot": 0,
            "epoch": 0,
            "shardlist": digest_of(body),
            "positions": positions([3, 1]),
        }
        answer = http.post("/v1/plans", json=plan)
        assert answer.status_code == 200
        assert [(p["id"], p["len"]) for p in http.get("/v1/plans").json()] == [(answer.json()["plan"], 2)]
        wait_for(
            lambda: http.get("/v1/stats").json()["resident_shards"] == 2, "the planned shards prefetched"
        )
        resident = {shard["url"] for shard in http.get("/v1/shards").json()["shards"]}
    assert resident == {urls[3], urls[1]}


def test_concurrent_uploads_of_one_shard_list_all_succeed(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--prefetch-depth", "0"])
    body = blob(
        [*local_shards.local_paths, *(f"{local_shards.local_dir}/more-{i}.tar" for i in range(50_000))]
    )
    answers: list[int] = []

    def upload() -> None:
        with api(daemon) as http:
            answers.append(http.put(f"/v1/shardlists/{digest_of(body)}", content=body).status_code)

    threads = [threading.Thread(target=upload) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [200] * 4
    plan = {"job": "j", "slot": 0, "epoch": 0, "shardlist": digest_of(body), "positions": positions([50_003])}
    with api(daemon) as http:
        assert http.post("/v1/plans", json=plan).status_code == 200


def test_the_same_positions_registered_again_are_the_same_plan(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--prefetch-depth", "0"])
    body = blob(local_shards.local_paths)
    plan = {"job": "j", "slot": 0, "epoch": 0, "shardlist": digest_of(body), "positions": positions([0, 2])}
    with api(daemon) as http:
        http.put(f"/v1/shardlists/{digest_of(body)}", content=body).raise_for_status()
        first = http.post("/v1/plans", json=plan).json()["plan"]
        assert http.post("/v1/plans", json=plan).json()["plan"] == first
        other = http.post("/v1/plans", json={**plan, "positions": positions([2, 0])}).json()["plan"]
        assert other != first and [p["id"] for p in http.get("/v1/plans").json()] == [other]


def test_a_plan_as_an_older_client_sends_it_registers_as_before(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--prefetch-depth", "1"])
    urls = local_shards.local_paths
    with api(daemon) as http:
        # The whole body of an older client: its urls, and no other field than these four.
        answer = http.post("/v1/plans", json={"job": "j", "slot": 1, "epoch": 0, "urls": [urls[2], urls[0]]})
        assert answer.status_code == 200
        assert [(p["slot"], p["len"]) for p in http.get("/v1/plans").json()] == [(1, 2)]
        wait_for(lambda: http.get("/v1/stats").json()["resident_shards"] == 1, "the first planned shard")
        assert [s["url"] for s in http.get("/v1/shards").json()["shards"]] == [urls[2]]


def test_a_plan_naming_a_shard_list_the_daemon_does_not_hold_is_404_unknown_shardlist(
    daemon_factory, local_shards: ShardSet
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    digest = digest_of(b"never uploaded")
    with api(daemon) as http:
        answer = http.post(
            "/v1/plans",
            json={"job": "j", "slot": 0, "epoch": 0, "shardlist": digest, "positions": positions([0])},
        )
    assert answer.status_code == 404
    assert answer.json()["error"] == "unknown_shardlist"
    assert f"PUT /v1/shardlists/{digest}" in answer.json()["detail"]


def test_a_shard_list_whose_body_is_not_its_digest_is_refused_with_409(
    daemon_factory, local_shards: ShardSet
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    body = blob(local_shards.local_paths)
    with api(daemon) as http:
        answer = http.put(f"/v1/shardlists/{digest_of(b'other')}", content=body)
    assert answer.status_code == 409 and answer.json()["error"] == "digest_mismatch"
    assert digest_of(body) in answer.json()["detail"]


def test_a_shard_list_with_a_url_outside_the_allow_list_is_refused_naming_it(
    daemon_factory, local_shards: ShardSet
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    body = blob([*local_shards.local_paths, "/etc/forbidden.tar"])
    with api(daemon) as http:
        answer = http.put(f"/v1/shardlists/{digest_of(body)}", content=body)
    assert answer.status_code == 403 and "/etc/forbidden.tar" in answer.json()["detail"]


def test_a_position_outside_the_shard_list_is_refused_with_422(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    body = blob(local_shards.local_paths)
    plan = {"job": "j", "slot": 0, "epoch": 0, "shardlist": digest_of(body), "positions": positions([0, 4])}
    with api(daemon) as http:
        http.put(f"/v1/shardlists/{digest_of(body)}", content=body).raise_for_status()
        answer = http.post("/v1/plans", json=plan)
    assert answer.status_code == 422 and "outside the shard list" in answer.json()["detail"]


# -- reading shard lists and making plans of them -------------------------------------------------------


def test_a_long_shard_list_is_read_in_batches_into_its_canonical_urls_ids() -> None:
    urls = [f"S3://b/d/../{i}.tar" for i in range(5_001)]
    body = blob(urls)
    table = UrlTable()
    listed = read_shardlist([body[:100], body[100:]], digest_of(body), AllowList(["s3://b"]), 10_000, table)
    assert table.urls(listed.ids) == [f"s3://b/{i}.tar" for i in range(5_001)]


def test_a_shard_list_longer_than_the_plan_bound_is_refused() -> None:
    body = blob(["s3://b/1", "s3://b/2", "s3://b/3"])
    with pytest.raises(PlanTooLarge, match="--max-plan-urls"):
        read_shardlist([body], digest_of(body), AllowList(["s3://b"]), 2, UrlTable())


def test_a_shard_list_names_the_first_url_it_refuses() -> None:
    body = blob(["s3://b/1", "s3://elsewhere/2"])
    with pytest.raises(NotAllowed, match="s3://elsewhere/2"):
        read_shardlist([body], digest_of(body), AllowList(["s3://b"]), 10, UrlTable())


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    length=st.integers(1, 60),
    distinct=st.booleans(),
    kind=st.sampled_from(["permutation", "subset", "repeats"]),
)
def test_a_plan_over_a_shard_list_has_the_arrays_of_its_ids(
    seed: int, length: int, distinct: bool, kind: str
) -> None:
    rng = random.Random(seed)
    ids = rng.sample(range(1000), length) if distinct else [rng.randrange(length) for _ in range(length)]
    listed = ShardListIds.of("d", np.asarray(ids, dtype=np.int32))
    if kind == "permutation":
        chosen = rng.sample(range(length), length)
    elif kind == "subset":
        chosen = rng.sample(range(length), rng.randrange(length + 1))
    else:
        chosen = [rng.randrange(length) for _ in range(rng.randrange(2 * length))]
    plan = listed.plan(np.asarray(chosen, dtype=np.int32))
    expected = PlanArrays.of(np.asarray([ids[p] for p in chosen], dtype=np.int32))
    assert plan.ids.tolist() == expected.ids.tolist()
    assert plan.pairs.tolist() == expected.pairs.tolist()


def test_the_least_recently_used_shard_lists_go_past_the_bound_on_their_urls() -> None:
    lists = ShardLists(max_urls=5)
    for name, length in (("a", 2), ("b", 2), ("c", 2)):
        lists.put(ShardListIds.of(name, np.arange(length, dtype=np.int32)))
        if name == "b":
            lists.get("a")  # used: "b" is now the least recent
    assert lists.find("a") is not None and lists.find("c") is not None and lists.find("b") is None
    lists.put(ShardListIds.of("huge", np.arange(10, dtype=np.int32)))
    assert lists.find("huge") is not None and lists.find("a") is None  # the newest stays, alone
