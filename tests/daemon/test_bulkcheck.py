"""Gathering a plan's cached copies into chunks to check against the remote (bulkcheck.py): which copies,
grouped how, in what order."""

from __future__ import annotations

from pathlib import Path

from shardcached.bulkcheck import gather_chunks
from shardcached.keys import AllowList, cache_key
from shardcached.storage.layout import Entry
from shardcached.versions import PAGE


def entry(url: str, validated_at: float) -> Entry:
    key = cache_key(url, "v1")
    return Entry(
        key=key, url=url, version="v1", size=1, path=Path("/nonexistent") / key, validated_at=validated_at
    )


def test_only_resident_copies_confirmed_before_the_job_began_are_gathered() -> None:
    resident = {
        "s3://b/d/old": entry("s3://b/d/old", 5.0),
        "s3://b/d/recent": entry("s3://b/d/recent", 15.0),
    }
    chunks = gather_chunks(
        ["s3://b/d/new", "s3://b/d/recent", "s3://b/d/old", "s3://b/d/old"], resident, 10.0, None
    )
    assert [chunk.urls for chunk in chunks] == [["s3://b/d/old"]]
    assert chunks[0].first == 2  # its first position in the plan


def test_a_chunk_holds_one_directorys_urls_sorted_and_chunks_come_in_plan_order() -> None:
    plan = ["s3://b/x/3", "s3://b/y/1", "s3://b/x/1", "s3://b/y/0", "s3://b/x/2"]
    resident = {url: entry(url, 0.0) for url in plan}
    chunks = gather_chunks(plan, resident, 10.0, None)
    assert [(chunk.first, chunk.urls) for chunk in chunks] == [
        (0, ["s3://b/x/1", "s3://b/x/2", "s3://b/x/3"]),
        (1, ["s3://b/y/0", "s3://b/y/1"]),
    ]


def test_a_chunk_holds_at_most_a_page() -> None:
    plan = [f"s3://b/d/{i:05d}" for i in range(PAGE + 1)]
    chunks = gather_chunks(plan, {url: entry(url, 0.0) for url in plan}, 10.0, None)
    assert [len(chunk.urls) for chunk in chunks] == [PAGE, 1]


def test_unlisted_remotes_are_chunked_in_plan_order() -> None:
    plan = ["https://h/z.tar", "https://h/a.tar"]
    chunks = gather_chunks(plan, {url: entry(url, 0.0) for url in plan}, 10.0, None)
    assert [chunk.urls for chunk in chunks] == [plan]


def test_copies_under_an_immutable_prefix_are_not_gathered() -> None:
    plan = ["s3://b/frozen/a", "s3://b/live/a"]
    chunks = gather_chunks(plan, {url: entry(url, 0.0) for url in plan}, 10.0, AllowList(["s3://b/frozen"]))
    assert [chunk.urls for chunk in chunks] == [["s3://b/live/a"]]
