"""Remote versions in pages (versions.py) against a real S3 endpoint: a listing page gives the versions a
HEAD gives, answers for every pending url up to its last key, and a walk over far-apart keys jumps."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from shardcached.fetching.fetcher import Fetcher
from shardcached.versions import RemoteVersions

_buckets = itertools.count()


@pytest.fixture
def listed_bucket(s3_client: Any) -> list[str]:
    """A bucket with 40 small objects `dir/k00`..`dir/k39` (and one outside `dir/`); their urls, sorted."""
    bucket = f"versions-{next(_buckets)}"
    s3_client.create_bucket(Bucket=bucket)
    for i in range(40):
        s3_client.put_object(Bucket=bucket, Key=f"dir/k{i:02d}", Body=b"x" * (i + 1))
    s3_client.put_object(Bucket=bucket, Key="other/k00", Body=b"y")
    return [f"s3://{bucket}/dir/k{i:02d}" for i in range(40)]


def counted_fetcher() -> tuple[Fetcher, Counter[str]]:
    sent: Counter[str] = Counter()
    return Fetcher(retries=0, on_request=lambda op: sent.update([op])), sent


def test_a_listing_gives_the_version_a_head_gives(listed_bucket: list[str]) -> None:
    fetcher, _ = counted_fetcher()
    page = RemoteVersions(fetcher).page(listed_bucket, None, threading.Event())
    assert page.covered == 40
    assert {url: page.found[url] for url in listed_bucket} == {
        url: fetcher.info(url) for url in listed_bucket
    }


def test_a_page_answers_for_the_pending_urls_up_to_its_last_key(listed_bucket: list[str]) -> None:
    fetcher, sent = counted_fetcher()
    pending = listed_bucket[10:30]
    page = RemoteVersions(fetcher, page_size=5).page(pending, None, threading.Event())
    assert sorted(page.found) == listed_bucket[10:15]
    assert (page.covered, page.last, page.confirmed) == (5, listed_bucket[14], False)
    assert sent == {"list": 1}


def test_a_walk_over_far_apart_keys_takes_one_request_per_key(listed_bucket: list[str]) -> None:
    fetcher, sent = counted_fetcher()
    versions = RemoteVersions(fetcher, page_size=5)
    pending = [listed_bucket[3], listed_bucket[20], listed_bucket[37]]
    done = 0
    while done < len(pending):
        page = versions.page(pending[done:], None, threading.Event())
        assert pending[done] in page.found
        done += page.covered
    assert sent == {"list": 3}  # not the 8 pages of the whole directory


def test_an_object_missing_from_the_listing_is_answered_for_but_not_found(listed_bucket: list[str]) -> None:
    fetcher, _ = counted_fetcher()
    gone = listed_bucket[5] + "-gone"
    pending = [listed_bucket[5], gone, listed_bucket[6]]
    page = RemoteVersions(fetcher).page(pending, None, threading.Event())
    assert page.covered == 3
    assert gone not in page.found and not page.confirmed  # a HEAD is to tell


def test_a_walk_whose_page_covered_nothing_goes_on_after_its_last_key(s3_client: Any) -> None:
    bucket = f"versions-{next(_buckets)}"
    s3_client.create_bucket(Bucket=bucket)
    # Keys in the sliver between `dir/b` and what sorts right before it (`dir/a` and the top code point).
    for i in range(5):
        s3_client.put_object(Bucket=bucket, Key=f"dir/a\U0010ffff{i}", Body=b"x")
    s3_client.put_object(Bucket=bucket, Key="dir/b", Body=b"y")
    fetcher, _ = counted_fetcher()
    versions = RemoteVersions(fetcher, page_size=3)
    pending = [f"s3://{bucket}/dir/b"]
    first = versions.page(pending, None, threading.Event())
    assert first.covered == 0 and first.last == f"s3://{bucket}/dir/a\U0010ffff2"
    second = versions.page(pending, first.last, threading.Event())
    assert second.covered == 1 and pending[0] in second.found


def test_local_files_are_checked_by_stat_many_to_a_page(tmp_path: Path) -> None:
    paths = []
    for i in range(3):
        path = tmp_path / f"shard_{i}.tar"
        path.write_bytes(b"z" * (i + 1))
        paths.append(str(path))
    gone = str(tmp_path / "gone.tar")
    fetcher, sent = counted_fetcher()
    page = RemoteVersions(fetcher).page([*paths, gone], None, threading.Event())
    assert page.covered == 4 and page.confirmed
    assert page.found == {path: fetcher.info(path) for path in paths}
    assert sent == {}  # a stat is no remote request
