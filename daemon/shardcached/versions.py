"""The remote versions of many objects in few requests, for validating cached copies in bulk.

On S3 one `ListObjectsV2` request answers for up to 1,000 objects of a prefix with their ETag and size: the
version a HEAD gives (`RemoteInfo.of`), so one page of a listing validates up to 1,000 copies for the price
of one HEAD. A page starts right before the first url still to check (`StartAfter`, `just_before`), so a
walk over far-apart keys jumps from one to the next instead of listing everything between them, and over
dense keys each page covers a thousand.

Other protocols have no listing that carries versions (http) or need none (a local stat is the check):
their objects are checked with one `info` each, a page of local files holding many.

Blocking: for worker threads. Each request runs under the fetcher's retry policy and is counted by it
(`shardcache_remote_requests_total{op="list"|"head"}`).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardcached.errors import NotFound
from shardcached.fetching.fetcher import Fetcher, RemoteInfo
from shardcached.keys import is_local

LISTED_SCHEMES = ("s3", "s3a")  # remotes whose listings give every object's version
PAGE = 1_000  # objects one listing request returns at most (S3's own bound), and local files per page


def listed(url: str) -> bool:
    """Whether the versions of `url`'s directory come from listings (else one `info` per object)."""
    return url.partition("://")[0] in LISTED_SCHEMES


def just_before(key: str) -> str:
    """A string that sorts right before `key`, for `StartAfter`: a listing then starts at `key`, or at one of
    the keys (if any) in the sliver between the two.

    `key` less its last character, that character's predecessor and the highest code point. S3 orders keys
    by their UTF-8 bytes, which is the order of code points Python compares. Never after `key`, so no key
    is ever skipped.

    >>> just_before("dir/k37") < "dir/k37" and just_before("dir/k37") > "dir/k36z"
    True
    """
    before = ord(key[-1]) - 1
    if before < 0:
        return key[:-1]
    if 0xD800 <= before <= 0xDFFF:  # surrogates are not characters UTF-8 can carry
        before = 0xD7FF
    return key[:-1] + chr(before) + "\U0010ffff"


def directory(url: str) -> str:
    """The directory a listing of `url` is asked for: everything up to its last '/'."""
    return url.rpartition("/")[0] + "/"


@dataclass(frozen=True)
class Page:
    """What one request answered.

    Attributes:
        found: canonical url -> version, for every object the request saw (a listing also reports objects
            that were not asked for: they are validated too).
        covered: how many of the pending urls, from the first, the request answered for: found, or absent
            where the request would have shown them.
        last: the last url a listing returned; a walk whose page covered nothing goes on after it.
        confirmed: whether an absent url is known to be gone (an `info` said so) or only missing from a
            listing, which a HEAD then confirms.
    """

    found: dict[str, RemoteInfo]
    covered: int
    last: str | None = None
    confirmed: bool = True


class RemoteVersions:
    """Blocking version lookups in pages, through the fetcher's filesystems, retries and counters."""

    def __init__(self, fetcher: Fetcher, page_size: int = PAGE) -> None:
        self._fetcher = fetcher
        self.page_size = page_size  # objects a request answers for at most (smaller in tests)

    def page(self, pending: Sequence[str], after: str | None, cancel: threading.Event) -> Page:
        """The versions of the first of `pending` (canonical urls; sorted, and in one directory, when
        `listed`) as far as one request goes; `after`: a listed url to continue a walk after.

        Raises:
            RemoteError, NotAllowed...: as the fetcher's requests, once the retries are spent.
        """
        if listed(pending[0]):
            return self._list(pending, after, cancel)
        count = self.page_size if is_local(pending[0]) else 1
        found: dict[str, RemoteInfo] = {}
        for url in pending[:count]:
            try:
                found[url] = self._fetcher.info(url, cancel)
            except NotFound:
                continue
        return Page(found, min(count, len(pending)))

    def _list(self, pending: Sequence[str], after: str | None, cancel: threading.Event) -> Page:
        first = pending[0]
        scheme, _, rest = first.partition("://")
        bucket, _, key = rest.partition("/")
        base = f"{scheme}://{bucket}/"
        prefix = directory(key) if "/" in key else ""
        start = after[len(base) :] if after is not None else just_before(key)
        fs, _ = self._fetcher.filesystems.resolve(first)

        def attempt() -> dict[str, Any]:
            self._fetcher.sent(first, "list")
            answer: dict[str, Any] = fs.call_s3(
                "list_objects_v2", Bucket=bucket, Prefix=prefix, StartAfter=start, MaxKeys=self.page_size
            )
            return answer

        answer = self._fetcher.retry.run(base + prefix, attempt, cancel)
        contents = answer.get("Contents") or []
        found = {base + item["Key"]: RemoteInfo.of(item) for item in contents}
        last = base + contents[-1]["Key"] if contents else None
        # A complete listing (not truncated) answered for every pending url; a truncated one for those up
        # to its last key.
        covered = len(pending)
        if answer.get("IsTruncated") and last is not None:
            covered = bisect_right(pending, last)
        return Page(found, covered, last, confirmed=False)
