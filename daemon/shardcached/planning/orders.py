"""Two ordered sets over numpy arrays, for the next-use index: a plan's owned positions and the idle order.

Both hold up to millions of entries, and both are written by hand rather than taken from sortedcontainers:
a `SortedList` keeps its entries as Python ints in Python lists, which the cyclic garbage collector walks
entry by entry on every full collection (50 ms for 10^6 ints here), and a million small objects cost ~40 MB.
A numpy array is one object the collector never enters. The operations the index needs are few and their
cost is bounded by a block of the array, not by its length:

* `PositionSet`, the positions of one plan a set of urls is filed under: a bitmap over the plan's positions
  with a count per block of `BLOCK` positions, so the largest member below a position is found in the
  block itself or the nearest block that counts one (O(BLOCK + n / BLOCK) in C, a few microseconds).
* `MinOrder`, keys (int64) by url id with the minimum of each block of `BLOCK` ids: the smallest key is
  the smallest block minimum, then the smallest key in that block; the next smallest is found the same way
  with the ones already met set aside (`first`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

BLOCK = 1024
ABSENT = np.iinfo(np.int64).max  # the key of an id that is not in a `MinOrder`


def distinct(values: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The distinct values, ascending, as int64.

    `np.unique` would do, but its first call imports `numpy.ma` (100-300 ms, on the event loop, in the
    first plan's first indexing step)."""
    ordered = np.sort(values).astype(np.int64, copy=False)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=np.bool_)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


class PositionSet:
    """A set of positions in [0, length), ordered, as a bitmap with per-block counts."""

    __slots__ = ("_bits", "_counts", "_size", "_max")

    def __init__(self, length: int) -> None:
        self._bits = np.zeros(length, dtype=np.bool_)
        self._counts = np.zeros(-(-length // BLOCK), dtype=np.int32)
        self._size = 0
        self._max: int | None = -1  # the largest member (-1: empty); None: not known, found when asked

    def __len__(self) -> int:
        return self._size

    def __contains__(self, position: int) -> bool:
        return bool(self._bits[position])

    def add(self, position: int) -> None:
        if not self._bits[position]:
            self._bits[position] = True
            self._counts[position // BLOCK] += 1
            self._size += 1
            if self._max is not None and position > self._max:
                self._max = position

    def remove(self, position: int) -> None:
        if self._bits[position]:
            self._bits[position] = False
            self._counts[position // BLOCK] -= 1
            self._size -= 1
            if position == self._max:
                self._max = None

    def add_many(self, positions: npt.NDArray[np.int64]) -> None:
        """Add positions (none of them a member yet, no repeats)."""
        if len(positions):
            self._bits[positions] = True
            self._counts += np.bincount(positions // BLOCK, minlength=len(self._counts)).astype(np.int32)
            self._size += len(positions)
            if self._max is not None:
                self._max = max(self._max, int(positions.max()))

    def remove_many(self, positions: npt.NDArray[np.int64]) -> None:
        """Remove positions (all of them members, no repeats)."""
        if len(positions):
            self._bits[positions] = False
            self._counts -= np.bincount(positions // BLOCK, minlength=len(self._counts)).astype(np.int32)
            self._size -= len(positions)
            self._max = None

    def between(self, start: int, stop: int) -> npt.NDArray[np.int64]:
        """The members in [start, stop), ascending."""
        return np.flatnonzero(self._bits[start:stop]) + start

    def members(self) -> npt.NDArray[np.int64]:
        return np.flatnonzero(self._bits)

    def last(self) -> int | None:
        """The largest member, or None when empty."""
        if self._max is None:
            found = self.before(len(self._bits))
            self._max = -1 if found is None else found
        return None if self._max < 0 else self._max

    def before(self, position: int) -> int | None:
        """The largest member below `position`, or None."""
        if position <= 0 or self._size == 0:
            return None
        block = (position - 1) // BLOCK
        start = block * BLOCK
        if self._counts[block]:
            found = np.flatnonzero(self._bits[start:position])
            if len(found):
                return start + int(found[-1])
        blocks = np.flatnonzero(self._counts[:block])
        if not len(blocks):
            return None
        start = int(blocks[-1]) * BLOCK
        return start + int(np.flatnonzero(self._bits[start : start + BLOCK])[-1])


class MinOrder:
    """Keys by id (int64, unique among the members), ordered: the smallest first, in blocks of ids."""

    __slots__ = ("_keys", "_mins", "_size")

    def __init__(self, capacity: int = BLOCK) -> None:
        blocks = max(1, -(-capacity // BLOCK))
        self._keys = np.full(blocks * BLOCK, ABSENT, dtype=np.int64)
        self._mins = np.full(blocks, ABSENT, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __contains__(self, uid: int) -> bool:
        return uid < len(self._keys) and self._keys[uid] != ABSENT

    def key(self, uid: int) -> int | None:
        if uid >= len(self._keys):
            return None
        key = int(self._keys[uid])
        return None if key == ABSENT else key

    def _grow(self, uid: int) -> None:
        blocks = max(2 * len(self._mins), uid // BLOCK + 1)
        keys = np.full(blocks * BLOCK, ABSENT, dtype=np.int64)
        keys[: len(self._keys)] = self._keys
        mins = np.full(blocks, ABSENT, dtype=np.int64)
        mins[: len(self._mins)] = self._mins
        self._keys, self._mins = keys, mins

    def set(self, uid: int, key: int) -> None:
        """File `uid` under `key` (refiled if it is a member)."""
        if uid >= len(self._keys):
            self._grow(uid)
        old = self._keys[uid]
        if old == ABSENT:
            self._size += 1
        self._keys[uid] = key
        block = uid // BLOCK
        if key < self._mins[block]:
            self._mins[block] = key
        elif old == self._mins[block]:
            self._mins[block] = self._keys[block * BLOCK : (block + 1) * BLOCK].min()

    def discard(self, uid: int) -> None:
        if uid >= len(self._keys) or self._keys[uid] == ABSENT:
            return
        old = self._keys[uid]
        self._keys[uid] = ABSENT
        self._size -= 1
        block = uid // BLOCK
        if old == self._mins[block]:
            self._mins[block] = self._keys[block * BLOCK : (block + 1) * BLOCK].min()

    def set_many(self, uids: npt.NDArray[np.int64], keys: npt.NDArray[np.int64]) -> None:
        """File each of `uids` (no repeats) under its key."""
        if not len(uids):
            return
        top = int(uids.max())
        if top >= len(self._keys):
            self._grow(top)
        absent = int(np.count_nonzero(self._keys[uids] == ABSENT))
        self._size += absent
        self._keys[uids] = keys
        if absent < len(uids):
            self._refresh(uids)  # a key may have grown: the blocks' minima are computed again
            return
        # Only new members: each block's minimum can only fall, to the least new key in it (one pass over
        # the new keys; recomputing every block they touch costs the whole array for scattered ids).
        blocks = uids // BLOCK
        order = np.argsort(blocks, kind="stable")
        blocks, ordered = blocks[order], keys[order]
        starts = np.flatnonzero(np.concatenate(([True], blocks[1:] != blocks[:-1])))
        touched = blocks[starts]
        self._mins[touched] = np.minimum(self._mins[touched], np.minimum.reduceat(ordered, starts))

    def discard_many(self, uids: npt.NDArray[np.int64]) -> None:
        uids = uids[uids < len(self._keys)]
        if not len(uids):
            return
        self._size -= int(np.count_nonzero(self._keys[uids] != ABSENT))
        self._keys[uids] = ABSENT
        self._refresh(uids)

    def _refresh(self, uids: npt.NDArray[np.int64]) -> None:
        blocks = distinct(uids // BLOCK)
        rows = self._keys.reshape(-1, BLOCK)
        self._mins[blocks] = rows[blocks].min(axis=1)

    def first(self, accept: Callable[[int], bool]) -> int | None:
        """The id with the smallest key that `accept` accepts (asked in key order), or None."""
        keys, mins = self._keys, self._mins
        passed: list[int] = []  # ids set aside (their keys were moved out of the way), put back below
        saved: list[int] = []
        try:
            while True:
                block = int(mins.argmin())
                if mins[block] == ABSENT:
                    return None
                start = block * BLOCK
                uid = start + int(keys[start : start + BLOCK].argmin())
                if accept(uid):
                    return uid
                passed.append(uid)
                saved.append(int(keys[uid]))
                keys[uid] = ABSENT
                mins[block] = keys[start : start + BLOCK].min()
        finally:
            for uid, key in zip(passed, saved, strict=True):
                keys[uid] = key
                block = uid // BLOCK
                if key < mins[block]:
                    mins[block] = key
