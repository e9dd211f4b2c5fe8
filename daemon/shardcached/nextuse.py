"""The resident shards' next uses, kept ordered so that one eviction decision costs O(C + log R), not O(R).

R is the number of resident shards, C the number of (job, slot) chains. A url's estimated next-use time is
``min over chains c of t_c(url)``, and each chain's time line moves on every open of that chain (its base
and pace change), so no single global order by time stays valid. Two orders do:

* Within one chain, the order of uses is fixed: plan by plan (epochs ascending), then by position (every
  position of an earlier plan comes before every position of a later one, since the chain reads them in
  that order). So each chain keeps its resident urls sorted by ``(epoch, position)`` of their first use at or
  after the cursor; a cursor move pops the passed ones from the front and files them under their next use.
* Shards that no plan holds ahead of a cursor ("idle") rank by recency alone, which changes only when the url
  is touched: they are kept sorted by ``(recency rank, store order)``.

Each planned url is also filed once more, under one *owner*: the chain whose use of it was the earliest in
time when it was last filed (the times of that moment). A chain's owned entries keep its order, and a url's
owned entry is one of its uses, so its time there is never earlier than the url's exact next use: an upper
bound, however stale the owner has become since (paces change, cursors move). The farthest-next-use victim
is then found by a threshold walk over the owned orders (Fagin's TA, each url met at most once): walk them
from their far ends, always the one whose next entry is latest, evaluate each url met exactly, and stop once
the best exact time is later than every order's next entry (no url not yet met can be later). Ties go to the
earliest in store order, as the old linear scan did. A url met whose exact time is earlier than its owned
entry's has a stale owner: it is refiled under its earliest chain after the walk, so it is met once.

Walking every chain's full order instead (the first version) meets the entries of urls that another chain
needs sooner before it reaches the victim: right at an epoch start, with every resident shard ahead in the
current epoch and planned again in the next, that was every next-epoch entry. Under owners those entries are
not in the walk at all (see docs/benchmarks.md, "Eviction decisions at scale").

A dropped plan (a DELETE, a replaced plan, a stale slot's expiry) is refiled lazily: ``dropped`` only notes
its (chain, epoch), and ``refile_more`` refiles the resident urls filed under it in pieces (the daemon's
indexer, indexing.py), ~30 us each at 10^5 resident, where refiling them all at once held the loop 3-4.5 s.
Until then the orders are half-dropped: a url whose only use was the dropped plan is still filed under its
chain instead of idle, and the threshold walk's premise (entry times never decrease along a chain's order)
fails on the dead entries. So every reader of the orders (``least_recent_idle``, ``farthest``) first
settles what is pending, synchronously and in bulk (``settle``: ~10 us a url, the orders cut and merged):
decisions see exactly the eager state. The daemon does not let a decision settle: an open that needs room
awaits the pieces first (indexing.refiled), so a drop costs the loop only its pieces. Any other refile of a
url meanwhile (indexed, unindexed, passed) reads the live plans, so it is already right and the pending
refile of it is a no-op.

Pure bookkeeping for the planner (planner.py), which tells it when a url's uses may have changed (indexed or
unindexed in a plan, a cursor moved past it, touched) and when a url became resident or left. Run on the event
loop thread only.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from sortedcontainers import SortedList

from shardcached.plans import Chain, Plan, Positions, first_at_or_after

Key = tuple[int, int]  # (epoch, position) of a use within one chain
Entry = tuple[int, int, str]  # (epoch, position, url): one use, as filed in a chain's orders
UseTime = Callable[[Chain, int, int], float]  # a chain's estimated clock time of its use (epoch, position)


def uses_by_chain(positions: Positions, plans: dict[str, Plan], url: str) -> dict[Chain, Key]:
    """`url`'s first use ahead of the cursor in each chain that has one, as (epoch, position)."""
    uses: dict[Chain, Key] = {}
    for plan_id, where in positions.get(url, {}).items():
        plan = plans.get(plan_id)
        position = None if plan is None else first_at_or_after(where, plan.cursor)
        if plan is not None and position is not None:
            key = (plan.epoch, position)
            known = uses.get(plan.chain)
            if known is None or key < known:
                uses[plan.chain] = key
    return uses


def use_in(positions: Positions, plans: dict[str, Plan], url: str, chain: Chain) -> Key | None:
    """`url`'s first use ahead of the cursor in `chain`, as (epoch, position); None when none."""
    best: Key | None = None
    for plan_id, where in positions.get(url, {}).items():
        plan = plans.get(plan_id)
        if plan is None or plan.chain is not chain:
            continue
        position = first_at_or_after(where, plan.cursor)
        if position is not None and (best is None or (plan.epoch, position) < best):
            best = (plan.epoch, position)
    return best


def _earliest(keys: dict[Chain, Key], use_time: UseTime) -> Chain:
    """The chain whose use in `keys` comes first by `use_time` (the first such in `keys` on ties)."""
    if len(keys) == 1:
        return next(iter(keys))
    return min(keys, key=lambda chain: use_time(chain, *keys[chain]))


class NextUseIndex:
    """Resident urls: per chain by next use, and the idle ones by recency.

    Args:
        rank: the recency rank of a url (larger is more recent; 0 never used).
        uses: a url's first use ahead of the cursor in every chain that has one.
        use_in: a url's first use ahead of the cursor in one chain, or None.
        use_time: a chain's estimated time of one of its uses now, which picks a url's owner when it is
            filed (any choice is correct; the earliest keeps the walk short).
        by_recency_only: keep every resident url in the recency order (the lru policy): plans are ignored.
    """

    def __init__(
        self,
        rank: Callable[[str], int],
        uses: Callable[[str], dict[Chain, Key]],
        use_in: Callable[[str, Chain], Key | None],
        use_time: UseTime,
        *,
        by_recency_only: bool = False,
    ) -> None:
        self._rank = rank
        self._uses = uses
        self._use_in = use_in
        self._use_time = use_time
        self._by_recency_only = by_recency_only
        self._order = itertools.count()
        self._seq: dict[str, int] = {}  # resident url -> its place in the store's order (ties go first)
        self._keys: dict[str, dict[Chain, Key]] = {}  # planned resident url -> chain -> its next use there
        self._chains: dict[Chain, SortedList] = {}  # chain -> SortedList of every (epoch, position, url)
        self._owned: dict[Chain, SortedList] = {}  # chain -> SortedList of the entries of urls it owns
        self._owner: dict[str, tuple[Chain, Entry]] = {}  # planned resident url -> its owned entry
        self._idle: SortedList = SortedList()  # (rank, seq, url) of resident urls in no plan ahead
        self._idle_rank: dict[str, int] = {}  # idle url -> the rank it is filed under
        # (chain, epoch) of a dropped plan -> the last of its entries refiled (None: none yet); oldest first.
        self._pending: dict[tuple[Chain, int], Entry | None] = {}

    def __contains__(self, url: str) -> bool:
        return url in self._seq

    def __len__(self) -> int:
        return len(self._seq)

    def seq(self, url: str) -> int:
        """The url's place in the store's order (smaller is older)."""
        return self._seq[url]

    # -- residency --------------------------------------------------------------------------------------
    def add(self, url: str) -> None:
        """`url` became resident (last in the store's order)."""
        if url in self._seq:
            self.remove(url)
        self._seq[url] = next(self._order)
        uses = {} if self._by_recency_only else self._uses(url)
        if uses:
            self._keys[url] = uses
            for chain, (epoch, position) in uses.items():
                self._chain(chain).add((epoch, position, url))
            self._own(url, uses, self._use_time)
        else:
            self._file_idle(url)

    def remove(self, url: str) -> None:
        """`url` left the cache."""
        if url not in self._seq:
            return
        self._unfile_idle(url)
        self._disown(url)
        for chain, (epoch, position) in self._keys.pop(url, {}).items():
            self._drop_entry(chain, (epoch, position, url))
        del self._seq[url]

    # -- changes of next use ----------------------------------------------------------------------------
    def touched(self, url: str) -> None:
        """`url`'s recency changed: refile it if it is idle (or always, under recency only)."""
        if url in self._idle_rank:
            self._unfile_idle(url)
            self._file_idle(url)

    def replan(self, url: str, chain: Chain) -> None:
        """`url`'s uses in `chain` may have changed (indexed, unindexed, or passed by the cursor)."""
        if url not in self._seq or self._by_recency_only:
            return
        key = self._use_in(url, chain)
        keys = self._keys.get(url)
        old = None if keys is None else keys.get(chain)
        if old == key:
            return
        if old is not None and keys is not None:
            self._drop_entry(chain, (*old, url))
            del keys[chain]
        if key is not None:
            self._chain(chain).add((*key, url))
            if keys is None:
                self._unfile_idle(url)
                keys = self._keys[url] = {}
            keys[chain] = key
        if keys is not None and keys:
            self._own(url, keys, self._use_time)
        elif keys is not None:
            del self._keys[url]
            self._disown(url)
            self._file_idle(url)

    def dropped(self, chain: Chain, epoch: int) -> None:
        """`chain`'s plan for `epoch` is no longer live: its resident urls are to be refiled (their use there
        is gone), by `refile_more` in pieces or by `settle` before the next decision. O(1)."""
        if self._by_recency_only or chain not in self._chains:
            return
        # Dropped again while pending (the plan that replaced it): start over, since the entries the walk has
        # passed may be the replacement's, live until now.
        self._pending[(chain, epoch)] = None

    @property
    def refile_pending(self) -> bool:
        """Whether dropped plans still have resident urls to refile (see `refile_more`)."""
        return bool(self._pending)

    def refile_more(self, budget: int | None) -> bool:
        """Refile up to `budget` (None: all) entries of dropped plans, oldest drop first; True once none is
        left. Each (chain, epoch) is walked in its order from where the last piece stopped: a refile moves
        the url out of that epoch, or (the epoch's plan was replaced) to its live use there, met again as a
        no-op at worst."""
        while self._pending and (budget is None or budget > 0):
            (chain, epoch), after = next(iter(self._pending.items()))
            count, resume = self._refile(chain, epoch, after, budget)
            if resume is None:
                del self._pending[(chain, epoch)]
            else:
                self._pending[(chain, epoch)] = resume
            if budget is not None:
                budget -= count
        return not self._pending

    def settle(self) -> None:
        """Refile everything pending now: the orders are then exactly as if every drop had been eager."""
        if self._pending:
            self.refile_more(None)

    def passed(self, chain: Chain, epoch: int, cursor: int) -> None:
        """`chain`'s cursor now stands at `cursor` of its plan for `epoch` (earlier epochs are done): every
        url whose use there lies before it moves on to its next use."""
        order = self._chains.get(chain)
        if order is None:
            return
        # (epoch, cursor) sorts before every (epoch, cursor, url): the entries below it are the passed ones.
        for _, _, url in list(order.irange(maximum=(epoch, cursor), inclusive=(True, False))):
            self.replan(url, chain)

    # -- decisions --------------------------------------------------------------------------------------
    def least_recent_idle(self, usable: Callable[[str], bool]) -> str | None:
        """The least recent idle url that `usable` accepts (first in store order on ties), or None."""
        self.settle()
        idle: Iterator[tuple[int, int, str]] = iter(self._idle)
        return next((url for _, _, url in idle if usable(url)), None)

    def any_usable(self, usable: Callable[[str], bool]) -> bool:
        """Whether any resident url is accepted by `usable` (walks only past the ones it refuses). Reads the
        residency alone, which a pending refile does not change: nothing to settle."""
        return any(usable(url) for url in self._seq)

    def farthest(
        self,
        usable: Callable[[str], bool],
        entry_time: Callable[[Chain, int, int], float],
        next_time: Callable[[str], float | None],
    ) -> tuple[str, float] | None:
        """The planned url that `usable` accepts with the latest `next_time`, first in store order on ties.

        `entry_time(chain, epoch, position)` is that chain's estimate for one of its uses; it must not
        decrease along the chain's order (it is the chain's time line). `next_time(url)` is the exact
        estimate (the min over every plan holding the url), which decides.
        """
        self.settle()  # a dropped plan's entries would break the walk's premise (module docstring)
        heads: list[tuple[float, int, str, Chain, Iterator[Entry]]] = []
        for tiebreak, (chain, order) in enumerate(self._owned.items()):
            walk = reversed(order)
            epoch, position, url = next(walk)
            heads.append((-entry_time(chain, epoch, position), tiebreak, url, chain, walk))
        heapq.heapify(heads)
        best: str | None = None
        best_time = -float("inf")
        best_seq = 0
        stale: list[str] = []  # urls met whose owned entry is later than their exact time
        while heads:
            negative, tiebreak, url, chain, walk = heads[0]
            if -negative < best_time:
                break  # every url not met yet is needed sooner than the best one met
            if usable(url):
                when = next_time(url)
                seq = self._seq[url]
                if when is None or when < -negative:
                    stale.append(url)
                if when is not None and (when > best_time or (when == best_time and seq < best_seq)):
                    best, best_time, best_seq = url, when, seq
            following = next(walk, None)
            if following is None:
                heapq.heappop(heads)
            else:
                epoch, position, url = following
                heapq.heapreplace(heads, (-entry_time(chain, epoch, position), tiebreak, url, chain, walk))
        for url in stale:  # after the walk: its iterators must not see the orders change
            self._own(url, self._keys[url], entry_time)
        return None if best is None else (best, best_time)

    # -- internals --------------------------------------------------------------------------------------
    def _refile(
        self, chain: Chain, epoch: int, after: Entry | None, limit: int | None
    ) -> tuple[int, Entry | None]:
        """`replan(url, chain)` for the next `limit` (None: all) urls filed under `chain`'s `epoch` after
        `after`, with the same result, the sorted orders changed in bulk (cut and merged) rather than entry
        by entry (~10 us a url at 10^5 resident instead of ~25-45). (urls refiled, the last entry met if
        some are left, else None)."""
        order = self._chains.get(chain)
        if order is None:
            return 0, None
        # (epoch,) sorts before every (epoch, position, url), (epoch + 1,) after them.
        lo = order.bisect_left((epoch,)) if after is None else order.bisect_right(after)
        end = order.bisect_left((epoch + 1,))
        hi = end if limit is None else min(end, lo + limit)
        entries: list[Entry] = order[lo:hi]
        kept: list[Entry] = []  # entries that stay (the live plan of that epoch, if one replaced it)
        owned_out: dict[Chain, list[Entry]] = {}
        owned_in: dict[Chain, list[Entry]] = {}
        idle_in: list[tuple[int, int, str]] = []
        for entry in entries:
            url = entry[2]
            key = self._use_in(url, chain)
            keys = self._keys[url]
            if key == entry[:2]:
                kept.append(entry)
                continue
            del keys[chain]  # then set again: the dict's order (min's ties) as `replan` leaves it
            if key is not None:
                keys[chain] = key
                kept.append((*key, url))
            known = self._owner.get(url)
            if keys:
                owner = _earliest(keys, self._use_time)
                owned = (*keys[owner], url)
                if known is not None and known[0] is owner and known[1] == owned:
                    continue
                self._owner[url] = (owner, owned)
                owned_in.setdefault(owner, []).append(owned)
            else:
                del self._keys[url]
                self._owner.pop(url, None)
                rank = self._rank(url)
                self._idle_rank[url] = rank
                idle_in.append((rank, self._seq[url], url))
            if known is not None:
                owned_out.setdefault(known[0], []).append(known[1])
        del order[lo:hi]
        order.update(kept)
        if not order:
            del self._chains[chain]
        for owner, out in owned_out.items():
            listed = self._owned[owner]
            if len(out) * 8 >= len(listed):  # most of it: rebuild rather than remove one by one
                gone = set(out)
                listed = self._owned[owner] = SortedList(e for e in listed if e not in gone)
            else:
                for gone_entry in out:
                    listed.remove(gone_entry)
        for owner, filed in owned_in.items():
            self._owned.setdefault(owner, SortedList()).update(filed)
        for owner in owned_out:
            if owner in self._owned and not self._owned[owner]:
                del self._owned[owner]
        self._idle.update(idle_in)
        return len(entries), (entries[-1] if hi < end else None)

    def _chain(self, chain: Chain) -> SortedList:
        order = self._chains.get(chain)
        if order is None:
            order = self._chains[chain] = SortedList()
        return order

    def _own(self, url: str, keys: dict[Chain, Key], use_time: UseTime) -> None:
        """File `url` under the chain of its earliest use by `use_time` (the first such on ties)."""
        owner = _earliest(keys, use_time)
        entry = (*keys[owner], url)
        known = self._owner.get(url)
        if known is not None and known[0] is owner and known[1] == entry:
            return
        self._disown(url)
        order = self._owned.get(owner)
        if order is None:
            order = self._owned[owner] = SortedList()
        order.add(entry)
        self._owner[url] = (owner, entry)

    def _disown(self, url: str) -> None:
        known = self._owner.pop(url, None)
        if known is not None:
            owner, entry = known
            order = self._owned[owner]
            order.remove(entry)
            if not order:
                del self._owned[owner]

    def _drop_entry(self, chain: Chain, entry: tuple[int, int, str]) -> None:
        order = self._chains[chain]
        order.remove(entry)
        if not order:
            del self._chains[chain]

    def _file_idle(self, url: str) -> None:
        rank = self._rank(url)
        self._idle_rank[url] = rank
        self._idle.add((rank, self._seq[url], url))

    def _unfile_idle(self, url: str) -> None:
        rank = self._idle_rank.pop(url, None)
        if rank is not None:
            self._idle.remove((rank, self._seq[url], url))
