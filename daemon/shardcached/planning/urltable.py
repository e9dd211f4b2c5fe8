"""Integer ids for canonical urls, given once per node: the plans and the next-use index work on ids.

A plan is an array of ids and the index keeps its per-url state in arrays by id, so a url's text is held
once, here. A dict of str to int and an object array of the urls are both invisible to the cyclic garbage
collector (a dict holding no container is not tracked; a numpy array is never walked), so a table of
millions of urls adds nothing to a full collection. Ids are never reused: a url keeps its id for the life
of the daemon (it costs ~150 bytes; a node sees the shards of the datasets it serves).

Thread-safe for what the worker threads do (`ids`: the urls of a plan or a shard list, in batches), and
lock-free for the event loop's reads.

Example:
    >>> table = UrlTable()
    >>> table.ids(["s3://b/x", "s3://b/y", "s3://b/x"]).tolist()
    [0, 1, 0]
    >>> table.url(1), table.find("s3://b/z")
    ('s3://b/y', None)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_BATCH = 4096  # urls given ids per hold of the lock (a few hundred microseconds)


class UrlTable:
    """Canonical url <-> int id (0, 1, 2, ... in order of first sight)."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._urls: npt.NDArray[np.object_] = np.empty(1024, dtype=object)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._ids)

    def find(self, url: str) -> int | None:
        """The id of `url`, or None if it has none."""
        return self._ids.get(url)

    def id(self, url: str) -> int:
        """The id of `url`, given now if it has none."""
        uid = self._ids.get(url)
        if uid is None:
            with self._lock:
                uid = self._ids.get(url)
                if uid is None:
                    uid = self._add(url)
        return uid

    def ids(self, urls: Sequence[str]) -> npt.NDArray[np.int32]:
        """The ids of `urls` (given where missing), as an int32 array in their order.

        Batches go through the dict in C calls (`map`, `dict.fromkeys`, `update`) rather than a Python
        step per url: a million new urls took ~4 us each url by url on a loaded machine."""
        out = np.empty(len(urls), dtype=np.int32)
        get = self._ids.get
        for start in range(0, len(urls), _BATCH):
            batch = list(urls[start : start + _BATCH])
            found = list(map(get, batch))
            if None in found:
                with self._lock:
                    first = len(self._ids)
                    if found.count(None) == len(batch) and first == self._add_all(batch):
                        # All new and distinct (the first sight of a shard list): their ids are a range.
                        out[start : start + len(batch)] = np.arange(first, first + len(batch))
                        continue
                    missing = [url for url, uid in zip(batch, found, strict=True) if uid is None]
                    # Looked up again under the lock: another thread may have added some meanwhile.
                    self._add_all(missing)
                found = list(map(get, batch))
            out[start : start + len(batch)] = found  # type: ignore[assignment]  # no None left
        return out

    def url(self, uid: int) -> str:
        """The url of id `uid`."""
        return str(self._urls[uid])

    def urls(self, uids: npt.NDArray[np.integer]) -> list[str]:
        """The urls of several ids, in their order."""
        return self._urls[uids].tolist()  # type: ignore[no-any-return]

    def _add(self, url: str) -> int:
        """Give `url` the next id (the lock is held; `url` has none)."""
        self._add_all([url])
        return self._ids[url]

    def _add_all(self, urls: list[str]) -> int:
        """Give each of `urls` that has no id yet (repeats allowed) the next id, in order (the lock is
        held); the first id given, or -1 when some of `urls` had one or repeated."""
        fresh = [url for url in dict.fromkeys(urls) if url not in self._ids]
        first = len(self._ids)
        if first + len(fresh) > len(self._urls):
            grown = np.empty(max(2 * len(self._urls), first + len(fresh)), dtype=object)
            grown[:first] = self._urls[:first]
            self._urls = grown  # readers holding the old array only read ids it has
        self._urls[first : first + len(fresh)] = fresh
        self._ids.update(zip(fresh, range(first, first + len(fresh)), strict=True))
        return first if len(fresh) == len(urls) else -1
