"""Per-process memos of what is derived from a large immutable object, keyed by the object's identity.

A source over a million shards holds a tuple of a million `ShardRef`s; hashing or comparing it costs as much
as what we would derive from it (the job hash, the pipeline fingerprint), so those are memoised by the
object's identity instead. Each memo holds its last few objects strongly: an id is never reused while its
entry lives, at the price of keeping those few objects alive a little longer than their dataset.

No lock: entries are put and read under the GIL, and two threads racing on one entry compute the same
value twice (the memo of the winner stays). So a fork never inherits a held lock from here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """Values computed from (object, key), kept for the last `size` pairs (see the module)."""

    def __init__(self, size: int = 8) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[int, Hashable], tuple[object, V]] = OrderedDict()

    def get(self, obj: object, key: Hashable, compute: Callable[[], V]) -> V:
        """The value for (`obj`, `key`), from `compute()` the first time."""
        slot = (id(obj), key)
        entry = self._entries.get(slot)
        if entry is not None and entry[0] is obj:
            return entry[1]
        value = compute()
        self._entries[slot] = (obj, value)
        while len(self._entries) > self._size:
            try:
                self._entries.popitem(last=False)
            except KeyError:  # another thread emptied it meanwhile
                break
        return value
