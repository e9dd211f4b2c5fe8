"""Property tests of URL canonicalisation and the allow-list (`shardcached.keys`): nothing escapes a prefix.

Each property generates hostile URLs (`..`, `%2e%2e`, `//`, mixed-case schemes, userinfo, ports, other
buckets and hosts, symlinks) and, whenever the daemon would allow one, re-reads the canonical URL the way
the fetching library does (s3fs's path split, yarl for aiohttp, the kernel's realpath) and checks that the
object really lies under the allowed prefix.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import s3fs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from yarl import URL

from shardcached.errors import BadRequest, NotAllowed
from shardcached.keys import AllowList, canonicalize

SEGMENTS = [
    "..",
    ".",
    "",
    "%2e%2e",
    "%2E%2e",
    ".%2e",
    "%2f..",
    "%252e%252e",
    "train",
    "train2",
    "x.tar",
    "%00",
    "a?b",
    "a#b",
    "@",
    ";",
]
path_segments = st.lists(st.sampled_from(SEGMENTS), min_size=0, max_size=7)


def allowed_canonical(allow: AllowList, url: str) -> str | None:
    try:
        return allow.check(url)
    except (BadRequest, NotAllowed):
        return None


@settings(max_examples=400, deadline=None)
@given(
    scheme=st.sampled_from(["s3", "S3", "s3a", "gs", "s3:"]),
    bucket=st.sampled_from(
        ["data", "DATA", "Data", "user@data", "data:443", "data.evil", "other", "dat", "data@evil", ""]
    ),
    segments=path_segments,
)
def test_no_s3_url_outside_the_allowed_bucket_prefix_is_allowed(
    scheme: str, bucket: str, segments: list[str]
) -> None:
    allow = AllowList(["s3://data/train"])
    url = f"{scheme}://{bucket}/" + "/".join(segments)
    canonical = allowed_canonical(allow, url)
    if canonical is None:
        return
    fetched_bucket, _, key = s3fs.S3FileSystem._strip_protocol(canonical).partition("/")
    assert fetched_bucket == "data"
    assert key == "train" or key.startswith("train/")  # the prefix itself may name an object
    assert ".." not in key.split("/") and "." not in key.split("/")


@settings(max_examples=400, deadline=None)
@given(
    scheme=st.sampled_from(["https", "HTTPS", "http", "HtTpS"]),
    host=st.sampled_from(
        [
            "data.example.com",
            "DATA.example.com",
            "data.example.com:443",
            "data.example.com:8443",
            "data.example.com.evil.net",
            "user:pw@data.example.com",
            "data.example.com@169.254.169.254",
            "169.254.169.254",
            "[fd00:ec2::254]",
            "evil.net#@data.example.com",
            "evil.net\\@data.example.com",
            "data.example.com%2f@evil.net",
        ]
    ),
    segments=path_segments,
)
def test_no_http_url_outside_the_allowed_host_and_path_is_allowed(
    scheme: str, host: str, segments: list[str]
) -> None:
    allow = AllowList(["https://data.example.com/pub"])
    url = f"{scheme}://{host}/pub/" + "/".join(segments)
    canonical = allowed_canonical(allow, url)
    if canonical is None:
        return
    seen = URL(canonical)  # what aiohttp (fsspec's http) will request
    assert (seen.scheme, seen.host, seen.port) == ("https", "data.example.com", 443)
    assert seen.path == "/pub" or seen.path.startswith("/pub/")
    assert ".." not in seen.path.split("/")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """allowed/ (with a symlink to the outside and one that stays inside), allowed2/, outside/."""
    root = tmp_path_factory.mktemp("tree")
    for name in ("allowed/sub", "allowed2", "outside"):
        (root / name).mkdir(parents=True)
    for name in ("allowed/x.tar", "allowed/sub/x.tar", "allowed2/x.tar", "outside/x.tar"):
        (root / name).write_bytes(b"x")
    os.symlink(root / "outside", root / "allowed" / "link")
    os.symlink(root / "outside" / "x.tar", root / "allowed" / "evil.tar")
    os.symlink(root / "allowed" / "sub", root / "allowed" / "inner")
    return root


LOCAL_SEGMENTS = [
    "..",
    ".",
    "",
    "sub",
    "link",
    "inner",
    "evil.tar",
    "x.tar",
    "allowed",
    "allowed2",
    "outside",
    "%2e%2e",
]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    form=st.sampled_from(["plain", "file", "FILE", "file-localhost", "relative-tilde"]),
    segments=st.lists(st.sampled_from(LOCAL_SEGMENTS), min_size=1, max_size=6),
)
def test_no_local_path_escapes_the_allowed_directory(tree: Path, form: str, segments: list[str]) -> None:
    allowed = tree / "allowed"
    allow = AllowList([str(allowed)])
    tail = "/".join(segments)
    url = {
        "plain": f"{allowed}/{tail}",
        "file": f"file://{allowed}/{tail}",
        "FILE": f"FILE://{allowed}/{tail}",
        "file-localhost": f"file://localhost{allowed}/{tail}",
        "relative-tilde": f"~/../../{allowed}/{tail}",
    }[form]
    canonical = allowed_canonical(allow, url)
    if canonical is None:
        return
    real = os.path.realpath(canonical)
    assert real == canonical, "the checked path is not the path that is opened"
    assert os.path.commonpath([real, str(allowed)]) == str(allowed)


def test_cloud_metadata_endpoints_are_refused_under_an_http_allow_list() -> None:
    allow = AllowList(["https://data.example.com/pub", "s3://data/train"])
    for url in (
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "https://data.example.com@169.254.169.254/pub/x",
        "https://data.example.com/pub/../../latest/meta-data",
    ):
        with pytest.raises((NotAllowed, BadRequest)):
            allow.check(url)


def test_canonicalisation_is_idempotent_for_local_paths(tree: Path) -> None:
    once = canonicalize(f"file://{tree}/allowed/link/../x.tar")
    assert canonicalize(once) == once
