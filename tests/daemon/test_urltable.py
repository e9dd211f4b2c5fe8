"""Url ids: one per canonical url for the life of the daemon, dense, the same whichever thread asks."""

from __future__ import annotations

import threading

from shardcached.planning import UrlTable


def test_a_url_keeps_its_id_and_ids_are_given_densely_in_order_of_first_sight() -> None:
    table = UrlTable()
    assert table.ids(["s3://b/x", "s3://b/y", "s3://b/x"]).tolist() == [0, 1, 0]
    assert table.id("s3://b/z") == 2 and table.id("s3://b/y") == 1
    assert table.ids(["s3://b/z", "s3://b/w"]).tolist() == [2, 3]
    assert [table.url(i) for i in range(4)] == ["s3://b/x", "s3://b/y", "s3://b/z", "s3://b/w"]
    assert table.find("s3://b/v") is None and len(table) == 4


def test_threads_giving_ids_to_overlapping_urls_agree_on_one_id_per_url() -> None:
    table = UrlTable()
    urls = [f"s3://b/{i}" for i in range(20_000)]
    orders = [urls[k::3] + urls for k in range(3)]
    results: dict[int, list[int]] = {}

    def give(k: int) -> None:
        results[k] = table.ids(orders[k]).tolist()

    threads = [threading.Thread(target=give, args=(k,)) for k in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(table) == len(urls)
    assert sorted(table.id(url) for url in urls) == list(range(len(urls)))
    for k, order in enumerate(orders):
        assert results[k] == [table.id(url) for url in order]
