"""URL canonicalisation, the allow-list and cache keys (in-process unit tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardcached.errors import BadRequest, NotAllowed
from shardcached.keys import AllowList, cache_key, canonicalize, file_suffix


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("s3://Bucket/a/./b/../c.tar", "s3://bucket/a/c.tar"),
        ("s3://bucket/a/%2e%2e/b.tar", "s3://bucket/b.tar"),
        ("s3://bucket/../../etc/passwd", "s3://bucket/etc/passwd"),
        ("s3://bucket//a//b.tar", "s3://bucket/a/b.tar"),
        ("HTTP://Example.COM:80/a/../b c.tar", "http://example.com/b%20c.tar"),
        ("https://example.com:8443/x.tar?v=1#frag", "https://example.com:8443/x.tar?v=1"),
        ("file:///data/%2e%2e/etc/passwd", "/etc/passwd"),
        ("/data/../etc/passwd", "/etc/passwd"),
    ],
)
def test_urls_have_one_canonical_form(url, canonical):
    assert canonicalize(url) == canonical


def test_local_paths_resolve_symlinks(tmp_path: Path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert canonicalize(str(tmp_path / "link" / "x.tar")) == os.path.realpath(tmp_path / "real" / "x.tar")


@pytest.mark.parametrize("url", ["", "s3://", "s3:///key", "/data/a\x00b", "file://host/x", "http:///x"])
def test_malformed_urls_are_bad_requests(url):
    with pytest.raises(BadRequest):
        canonicalize(url)


def test_prefixes_match_on_segment_boundaries():
    allow = AllowList(["s3://bucket/pre", "/data/"])
    assert allow.allows("s3://bucket/pre/x.tar")
    assert allow.allows("s3://bucket/pre")
    assert not allow.allows("s3://bucket/prefix/x.tar")
    assert allow.allows("/data/x.tar")
    assert not allow.allows("/data2/x.tar")


def test_check_names_the_url_and_the_flag():
    with pytest.raises(NotAllowed, match=r"s3://other/x\.tar.*--allow"):
        AllowList(["s3://bucket"]).check("s3://other/x.tar")


def test_an_empty_allow_list_allows_nothing():
    with pytest.raises(NotAllowed):
        AllowList([]).check("/anything")


def test_cache_keys_change_with_the_remote_version():
    assert cache_key("s3://b/x", "etag1") != cache_key("s3://b/x", "etag2")
    assert cache_key("s3://b/x", "etag1") == cache_key("s3://b/x", "etag1")
    assert len(cache_key("s3://b/x", "v")) == 64


@pytest.mark.parametrize(
    ("url", "suffix"),
    [("s3://b/a.tar", ".tar"), ("s3://b/a.tar.gz", ".tar.gz"), ("s3://b/noext", ""), ("/d/.hidden", "")],
)
def test_cached_files_keep_the_urls_extension(url, suffix):
    assert file_suffix(url) == suffix
