"""Long plans and large listings: the event loop keeps answering, plans are bounded, listings are paged."""

from __future__ import annotations

import gc
import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.daemon_api import api
from harness.polling import wait_for
from harness.shards import ShardSet
from shardcached.errors import DaemonError, Invalid, NotAllowed, PlanTooLarge
from shardcached.keys import AllowList
from shardcached.planning import PlanBody, PlanIndexer, Planner, UrlTable, read_plan, read_prefetch


def body(planner: Planner, urls: list[str]) -> PlanBody:
    return PlanBody("j", 0, 0, planner.arrays(urls), str(hash(tuple(urls))), planner.table)


# -- the planner's chunked methods ------------------------------------------------------------------------


def test_a_plan_indexed_in_steps_answers_next_uses_as_one_indexed_at_once() -> None:
    urls = [f"u{i % 7}" for i in range(50)]
    whole, stepped = Planner(clock=lambda: 0.0), Planner(clock=lambda: 0.0)
    whole.add_plan("j", 0, 0, urls)
    plan, fresh = stepped.begin_plan("j", 0, 0, urls)
    assert fresh
    while not stepped.index_more(plan, 3):
        pass
    assert [stepped.next_use(f"u{i}") for i in range(7)] == [whole.next_use(f"u{i}") for i in range(7)]


def test_a_registered_plan_is_usable_before_its_tail_is_indexed() -> None:
    planner = Planner(clock=lambda: 0.0)
    indexer = PlanIndexer(planner, chunk=2)
    plan = indexer.register(body(planner, ["a", "b", "c", "d", "e"]))
    assert planner.has_plan(plan.id) and indexer.busy
    planner.record_open("a", plan.id)
    assert plan.cursor == 1
    assert planner.next_use("e") is None  # not indexed yet
    while indexer.step():
        pass
    assert planner.next_use("e") == 4.0


def test_an_identical_registration_returns_the_plan_being_indexed() -> None:
    planner = Planner(clock=lambda: 0.0)
    indexer = PlanIndexer(planner, chunk=2)
    first = indexer.register(body(planner, ["a", "b", "c", "d"]))
    assert indexer.register(body(planner, ["a", "b", "c", "d"])) is first


def test_a_dropped_plan_counts_for_nothing_before_its_entries_are_removed() -> None:
    planner = Planner(clock=lambda: 0.0)
    plan_id = planner.add_plan("j", 0, 0, ["a", "b", "c"])
    assert planner.drop_plan(plan_id)
    assert planner.unindex_pending
    assert planner.next_use("b") is None
    assert planner.choose_victim(["a", "b"]) in ("a", "b")
    while not planner.unindex_more(1):
        pass
    assert not planner.unindex_pending


def test_a_plan_dropped_while_being_indexed_stops_being_indexed() -> None:
    planner = Planner(clock=lambda: 0.0)
    indexer = PlanIndexer(planner, chunk=2)
    plan = indexer.register(body(planner, ["a", "b", "c", "d", "e"]))
    assert planner.drop_plan(plan.id)
    while indexer.step():
        pass
    assert plan.indexed == 0 and planner.next_use("a") is None


def test_a_long_plan_is_read_into_arrays_without_a_list_of_its_urls() -> None:
    urls = [f"s3://b/{i}" for i in range(5000)]
    raw = json.dumps({"job": "j", "slot": 0, "epoch": 0, "urls": urls}).encode()
    table = UrlTable()
    plan = read_plan([raw], AllowList(["s3://b"]), max_urls=10_000, table=table)
    assert plan.arrays.ids.tolist() == list(range(5000)) and plan.urls == urls
    assert not gc.is_tracked(plan.arrays.ids) and not gc.is_tracked(plan.arrays.pairs)


def test_an_indexing_step_stops_once_its_budget_is_spent() -> None:
    planner = Planner(clock=lambda: 0.0)
    ticks = iter(range(100))
    indexer = PlanIndexer(planner, chunk=2, budget_s=2, clock=lambda: float(next(ticks)))
    plan = indexer.register(body(planner, [f"u{i}" for i in range(20)]))
    assert indexer.step()  # the clock read 0 at its start, 1 after the first piece, 2 after the second
    assert plan.indexed == 2 + 2 * 2


def test_a_dropped_plans_positions_leave_the_index_in_pieces() -> None:
    planner = Planner(clock=lambda: 0.0)
    plan, _ = planner.begin_plan("j", 0, 0, [f"u{i}" for i in range(10)])
    planner.index_more(plan, 6)
    assert planner.drop_plan(plan.id)
    assert not planner.unindex_more(4)
    assert plan.indexed == 2
    assert planner.unindex_more(4) and plan.indexed == 0 and not planner.unindex_pending


def test_registering_a_plan_at_once_leaves_the_callers_url_list_alone() -> None:
    planner = Planner(clock=lambda: 0.0)
    urls = ["a", "b", "c"]
    assert planner.delete_plan(planner.add_plan("j", 0, 0, urls))
    assert urls == ["a", "b", "c"]


def test_the_planners_state_at_scale_adds_no_object_the_garbage_collector_walks() -> None:
    gc.collect()
    before = len(gc.get_objects())
    planner = Planner(clock=lambda: 0.0)
    urls = [f"s3://b/{i:06d}.tar" for i in range(100_000)]
    deal = [urls[i::8] for i in range(8)]
    for slot in range(8):
        for epoch in (0, 1):
            plan_id = planner.add_plan("j", slot, epoch, deal[(slot + epoch) % 8])
    for url in urls:
        planner.resident(url)
        planner.touch(url)
    for url in deal[0][:100]:
        planner.record_open(url, plan_id)
    assert planner.choose_resident_victim(lambda url: True) is not None
    gc.collect()
    # A few hundred objects whatever the number of shards: plans, chains, one ordered set per plan.
    assert len(gc.get_objects()) - before < 1_000


def test_retire_stale_drops_plans_and_leaves_their_entries_for_later() -> None:
    now = [0.0]
    planner = Planner(stale_after_s=10, clock=lambda: now[0])
    planner.add_plan("j", 0, 0, ["a", "b"])
    now[0] = 11.0
    assert planner.retire_stale() == 1
    assert planner.plan_count == 0 and planner.unindex_pending


# -- reading a plan's body -------------------------------------------------------------------------------


def test_a_plan_longer_than_the_bound_is_refused_naming_the_setting() -> None:
    raw = b'{"job": "j", "slot": 0, "epoch": 0, "urls": ["s3://b/1", "s3://b/2", "s3://b/3"]}'
    with pytest.raises(PlanTooLarge, match="--max-plan-urls") as caught:
        read_plan([raw], AllowList(["s3://b"]), max_urls=2, table=UrlTable())
    assert caught.value.status == 413


def test_plan_bodies_with_escapes_and_spacing_read_as_json_does() -> None:
    raw = b'{ "urls" : [ "s3://b/a\\u0062.tar" ,"s3://b/c d.tar"] , "job":"j","epoch":2, "slot":1 }'
    plan = read_plan([raw[:20], raw[20:]], AllowList(["s3://b"]), max_urls=10, table=UrlTable())
    assert (plan.job, plan.slot, plan.epoch) == ("j", 1, 2)
    assert plan.urls == ["s3://b/ab.tar", "s3://b/c d.tar"]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"job": "j", "slot": 0, "epoch": 0}',
        b'{"job": "j", "slot": -1, "epoch": 0, "urls": []}',
        b'{"job": "j", "slot": 0, "epoch": 0, "urls": [""]}',
        b'{"job": "j", "slot": 0, "epoch": 0, "urls": [], "extra": 1}',
        b'{"job": "j", "slot": 0, "epoch": 0, "urls": ["s3://b/x"',
        b"[]",
    ],
)
def test_a_malformed_plan_body_is_invalid(raw: bytes) -> None:
    with pytest.raises(Invalid):
        read_plan([raw], AllowList(["s3://b"]), max_urls=10, table=UrlTable())


def test_a_prefetch_body_reads_to_its_canonical_urls() -> None:
    raw = b'{"urls": ["S3://B/x.tar", "s3://b/d/../y.tar"]}'
    assert read_prefetch([raw], AllowList(["s3://b"])) == ["s3://b/x.tar", "s3://b/y.tar"]


@pytest.mark.parametrize("raw", [b'{"urls": []}', b"{}", b'{"urls": ["s3://b/x"], "job": "j"}'])
def test_a_malformed_prefetch_body_is_invalid(raw: bytes) -> None:
    with pytest.raises(Invalid):
        read_prefetch([raw], AllowList(["s3://b"]))


def test_a_prefetch_with_a_url_outside_the_allow_list_is_refused_naming_it() -> None:
    with pytest.raises(NotAllowed, match="s3://other/x"):
        read_prefetch([b'{"urls": ["s3://b/ok", "s3://other/x"]}'], AllowList(["s3://b"]))


_SEGMENT = st.sampled_from(
    ["a", "B", "x.tar", ".", "..", "", "%41", "c%2Fd", "e f", "g?h", "#i", "~j", "K-1"]
)


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(["s3://", "S3://", "gs://", "https://", "http://", "file://", "/"]),
    host=st.sampled_from(["bucket", "Bucket", "other", "", "host:443", "host:8080"]),
    segments=st.lists(_SEGMENT, min_size=1, max_size=4),
)
def test_checking_many_urls_by_directory_agrees_with_checking_each(
    scheme: str, host: str, segments: list[str]
) -> None:
    url = scheme + ("" if scheme in ("/", "file://") else host) + "/" + "/".join(segments)
    allow = AllowList(["s3://bucket/a", "https://host/x.tar", "/tmp/allowed", "gs://other"])
    try:
        expected: str | type[DaemonError] = allow.check(url)
    except DaemonError as exc:
        expected = type(exc)
    try:
        got: str | type[DaemonError] = allow.check_many([url])[0]
    except DaemonError as exc:
        got = type(exc)
    assert got == expected


def test_a_url_holding_a_newline_in_a_canonical_batch_is_refused() -> None:
    with pytest.raises(DaemonError, match="control characters"):
        AllowList(["s3://b"]).check_many(["s3://b/x.tar", "s3://b/y.tar\ns3://b/z.tar"])


def test_a_symlink_in_a_plan_is_resolved_like_an_open_resolves_it(tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    (tmp_path / "outside.tar").write_bytes(b"x")
    os.symlink(tmp_path / "outside.tar", tmp_path / "allowed" / "link.tar")
    allow = AllowList([str(tmp_path / "allowed")])
    with pytest.raises(NotAllowed, match="link.tar"):
        allow.check_many([str(tmp_path / "allowed" / "fine.tar"), str(tmp_path / "allowed" / "link.tar")])


# -- through the real daemon ----------------------------------------------------------------------------


def test_health_and_warm_opens_answer_while_a_long_plan_registers(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    shard = local_shards.local_paths[0]
    urls = [f"{local_shards.local_dir}/planned-{i:07d}.tar" for i in range(300_000)]
    registered = threading.Event()
    answers: list[int] = []

    def register() -> None:
        with api(daemon, timeout=600) as http:
            http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls}).raise_for_status()
        registered.set()

    with api(daemon) as http:
        lease = http.post("/v1/shards/open", json={"url": shard}).json()["lease"]  # now resident
        http.post("/v1/shards/release", json={"lease": lease}).raise_for_status()
        thread = threading.Thread(target=register)
        thread.start()
        while not registered.is_set():
            assert http.get("/v1/health").status_code == 200
            grant = http.post("/v1/shards/open", json={"url": shard}).json()
            http.post("/v1/shards/release", json={"lease": grant["lease"]}).raise_for_status()
            if not registered.is_set():
                answers.append(grant["hit"])
        thread.join()
        assert http.get("/v1/stats").json()["plans"] == 1
    # The registration parses and checks 300k urls (seconds): a loop it blocked would answer once or twice.
    assert len(answers) >= 10 and all(answers)


def test_a_plan_over_the_bound_is_refused_with_413(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)], extra_args=["--max-plan-urls", "3"])
    with api(daemon) as http:
        answer = http.post(
            "/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": local_shards.local_paths}
        )
        assert answer.status_code == 413
        assert answer.json()["error"] == "plan_too_large"
        assert "--max-plan-urls" in answer.json()["detail"]
        assert http.get("/v1/stats").json()["plans"] == 0


def test_a_long_plan_with_one_url_outside_the_allow_list_is_refused_naming_it(
    daemon_factory, local_shards: ShardSet
):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    urls = [f"{local_shards.local_dir}/p-{i}.tar" for i in range(20_000)] + ["/etc/forbidden.tar"]
    with api(daemon) as http:
        answer = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls})
    assert answer.status_code == 403
    assert "/etc/forbidden.tar" in answer.json()["detail"]


def test_a_long_plan_deleted_at_once_is_gone(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    urls = [f"{local_shards.local_dir}/p-{i}.tar" for i in range(50_000)]
    with api(daemon) as http:
        plan = http.post("/v1/plans", json={"job": "j", "slot": 0, "epoch": 0, "urls": urls}).json()["plan"]
        assert http.delete(f"/v1/plans/{plan}").status_code == 204
        assert http.get("/v1/stats").json()["plans"] == 0
        assert http.delete(f"/v1/plans/{plan}").status_code == 404


def test_listing_pages_return_every_resident_shard_exactly_once(daemon_factory, local_shards: ShardSet):
    daemon = daemon_factory(allow=[str(local_shards.local_dir)])
    with api(daemon) as http:
        for path in local_shards.local_paths:
            lease = http.post("/v1/shards/open", json={"url": path}).json()["lease"]
            http.post("/v1/shards/release", json={"lease": lease}).raise_for_status()
        wait_for(lambda: http.get("/v1/stats").json()["resident_shards"] == 4, "four resident shards")
        seen: list[str] = []
        page = http.get("/v1/shards", params={"limit": 3}).json()
        pages = 1
        seen += [s["url"] for s in page["shards"]]
        while page["next_after"] is not None:
            page = http.get("/v1/shards", params={"limit": 3, "after": page["next_after"]}).json()
            seen += [s["url"] for s in page["shards"]]
            pages += 1
    assert pages == 2
    assert seen == sorted(local_shards.local_paths)
