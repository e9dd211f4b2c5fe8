"""Prefetch, simulated against the real Planner: within capacity, never evicting a sooner-needed shard,
never past the depth limit, and interleaving jobs by estimated time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardcached.planning import Planner


class Node:
    """A unit-sized cache driven like the daemon drives it: prefetch between opens, demand fetch on miss."""

    def __init__(self, planner: Planner, capacity: int, max_fetches: int) -> None:
        self.planner = planner
        self.capacity = capacity
        self.max_fetches = max_fetches
        self.resident: set[str] = set()
        self.urls_of: dict[str, list[str]] = {}
        self.fetches = 0

    def add_plan(self, job: str, slot: int, epoch: int, urls: list[str]) -> str:
        pid = self.planner.add_plan(job, slot, epoch, urls)
        self.urls_of[pid] = urls
        return pid

    def within_depth(self) -> set[str]:
        """Urls at most prefetch_depth positions ahead of some (job, slot)'s cursor, by the test's count."""
        chains: dict[tuple[object, object], list[str]] = {}
        for plan in sorted(self.planner.describe(), key=lambda p: int(p["epoch"])):  # type: ignore[call-overload]
            rest = self.urls_of[str(plan["id"])][int(plan["cursor"]) :]  # type: ignore[call-overload]
            chains.setdefault((plan["job"], plan["slot"]), []).extend(rest)
        return {url for rest in chains.values() for url in rest[: self.planner.prefetch_depth]}

    def prefetch(self) -> None:
        for _ in range(self.capacity + 1):  # each round fetches at least one shard or stops
            candidates = self.planner.prefetch_candidates(lambda url: url in self.resident, self.max_fetches)
            assert len(candidates) <= self.max_fetches
            assert set(candidates) <= self.within_depth()
            progressed = False
            for url in candidates:
                if len(self.resident) >= self.capacity:
                    victim = self.planner.choose_victim(self.resident, incoming=url)
                    if victim is None:
                        break
                    wanted, gone = self.planner.next_use_at(url), self.planner.next_use_at(victim)
                    assert wanted is not None
                    assert gone is None or gone > wanted, f"evicted {victim} ({gone}) for {url} ({wanted})"
                    self.resident.remove(victim)
                    self.planner.forget(victim)
                self.resident.add(url)
                self.planner.touch(url)
                self.fetches += 1
                progressed = True
                assert len(self.resident) <= self.capacity
            if not progressed:
                return

    def open(self, url: str, plan: str) -> bool:
        """A client open; True on a hit."""
        self.planner.record_open(url, plan)
        if url in self.resident:
            return True
        if len(self.resident) >= self.capacity:
            victim = self.planner.choose_victim(self.resident, incoming=None)
            assert victim is not None
            self.resident.remove(victim)
            self.planner.forget(victim)
        self.resident.add(url)
        self.fetches += 1
        return False


universe = st.integers(0, 11).map(lambda i: f"s3://b/{i:02d}.tar")


@settings(max_examples=120, deadline=None)
@given(
    orders=st.lists(
        st.lists(st.lists(universe, min_size=3, max_size=3), min_size=2, max_size=3), min_size=1, max_size=3
    ),
    capacity=st.integers(1, 8),
    depth=st.integers(1, 3),
    max_fetches=st.integers(1, 4),
)
def test_prefetch_stays_within_capacity_depth_and_nearest_first_eviction(
    orders: list[list[list[str]]], capacity: int, depth: int, max_fetches: int
) -> None:
    now = [0.0]
    node = Node(Planner(prefetch_depth=depth, clock=lambda: now[0]), capacity, max_fetches)
    epochs = min(len(per_slot) for per_slot in orders)
    ids = {
        (s, e): node.add_plan("job", s, e, orders[s][e]) for s in range(len(orders)) for e in range(epochs)
    }
    for epoch in range(epochs):
        for i in range(3):
            for slot in range(len(orders)):
                node.prefetch()
                now[0] += 1.0
                node.open(orders[slot][epoch][i], ids[(slot, epoch)])


def test_prefetch_stops_at_the_depth_limit() -> None:
    node = Node(Planner(prefetch_depth=2, clock=lambda: 0.0), capacity=100, max_fetches=8)
    pid = node.add_plan("job", 0, 0, [f"u{i}" for i in range(10)])
    node.prefetch()
    assert node.resident == {"u0", "u1"}
    node.open("u0", pid)
    node.prefetch()
    assert node.resident == {"u0", "u1", "u2"}


def test_a_slot_reading_ahead_of_a_warm_cache_hits_every_open_after_the_first_prefetch() -> None:
    now = [0.0]
    node = Node(Planner(prefetch_depth=2, clock=lambda: now[0]), capacity=4, max_fetches=2)
    urls = [f"u{i}" for i in range(20)]
    pid = node.add_plan("job", 0, 0, urls)
    hits = []
    for url in urls:
        node.prefetch()
        now[0] += 1.0
        hits.append(node.open(url, pid))
    assert all(hits)
    assert node.fetches == len(urls)


def test_prefetch_interleaves_two_jobs_by_estimated_time() -> None:
    now = [0.0]
    planner = Planner(prefetch_depth=2, clock=lambda: now[0])
    slow = planner.add_plan("slow", 0, 0, ["s0", "s1", "s2", "s3"])
    fast = planner.add_plan("fast", 0, 0, ["f0", "f1", "f2", "f3", "f4"])
    for t, url, plan in (
        (0, "s0", slow),
        (10, "s1", slow),
        (11, "f0", fast),
        (12, "f1", fast),
        (13, "f2", fast),
    ):
        now[0] = float(t)
        planner.record_open(url, plan)
    # fast: f3 at 14, f4 at 15; slow: s2 at 20, s3 at 30 -> the fast job's two come first
    assert planner.prefetch_candidates(lambda url: False, limit=4) == ["f3", "f4", "s2", "s3"]


def test_a_deleted_plan_is_no_longer_prefetched() -> None:
    planner = Planner(prefetch_depth=2, clock=lambda: 0.0)
    gone = planner.add_plan("a", 0, 0, ["x", "y"])
    planner.add_plan("b", 0, 0, ["p"])
    planner.delete_plan(gone)
    assert planner.prefetch_candidates(lambda url: False, limit=10) == ["p"]


def test_a_stale_plan_is_no_longer_prefetched() -> None:
    now = [0.0]
    planner = Planner(prefetch_depth=2, stale_after_s=30.0, clock=lambda: now[0])
    planner.add_plan("a", 0, 0, ["x", "y"])
    now[0] = 31.0
    assert planner.prefetch_candidates(lambda url: False, limit=10) == []
    assert planner.plan_count == 0
