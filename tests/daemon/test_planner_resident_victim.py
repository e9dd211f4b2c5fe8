"""The ordered next-use index chooses exactly the victim of the linear scan it replaces.

`Planner.choose_victim(candidates, incoming)` is the reference: it ranks a list of candidates by walking every
plan holding each (the algorithm eviction used before nextuse.py). `Planner.choose_resident_victim(usable,
incoming)` answers from the ordered structures the planner keeps as shards become resident, plans come and
go and cursors move. Random operations drive one planner, and at every step both answer for the same pool (the
resident shards in the store's order that are not pinned): demand opens, prefetches and warms, under both
policies, with clock steps of zero so that estimated times tie across slots.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shardcached.planning import Planner, prefetch_victim

URLS = [f"s3://b/{i:02d}.tar" for i in range(24)]


class World:
    """A planner and a store-like resident set (insertion order is the store's order), driven at random."""

    def __init__(self, rng: random.Random, policy: str) -> None:
        self.rng = rng
        self.now = 0.0
        self.planner = Planner(
            policy=policy,
            prefetch_depth=2,
            stale_after_s=rng.choice([5.0, 1e9]),
            clock=lambda: self.now,
            displace_ahead=rng.choice([0, 1, 3]),
        )
        self.resident: dict[str, None] = {}
        self.pinned: set[str] = set()
        self.plans: list[str] = []

    def usable(self, url: str) -> bool:
        return url in self.resident and url not in self.pinned

    def pool(self) -> list[str]:
        return [url for url in self.resident if url not in self.pinned]

    def step(self) -> None:
        rng, planner = self.rng, self.planner
        op = rng.randrange(10)
        if op == 0:
            urls = [rng.choice(URLS) for _ in range(rng.randrange(0, 12))]
            self.plans.append(planner.add_plan(rng.choice("ab"), rng.randrange(3), rng.randrange(4), urls))
        elif op == 1 and self.plans:
            planner.delete_plan(self.plans.pop(rng.randrange(len(self.plans))))
        elif op in (2, 3, 4):
            self.open()
        elif op == 5:
            url = rng.choice(URLS)
            if url in self.resident:
                del self.resident[url]
                planner.gone(url)
                planner.forget(url)
            else:
                self.resident[url] = None
                planner.resident(url)
                if rng.random() < 0.7:
                    planner.touch(url)
        elif op == 6:
            self.pinned ^= {rng.choice(URLS)}
        elif op == 7:
            self.now += rng.choice([0.0, 0.0, 0.5, 1.0, 3.0])
        elif op == 8:
            if rng.random() < 0.5:
                planner.expire_stale()
            elif self.plans:
                planner.orphan(rng.choice(self.plans), rng.choice([0.0, 2.0]))
        else:
            planner.touch(rng.choice(URLS)) if rng.random() < 0.5 else planner.forget(rng.choice(URLS))

    def open(self) -> None:
        """An open under a plan (at its cursor, a jump ahead, or behind it) or without one."""
        rng, planner = self.rng, self.planner
        live = [p for p in self.plans if planner.has_plan(p)]
        if live and rng.random() < 0.8:
            plan_id = rng.choice(live)
            plan = planner.plan(plan_id)
            assert plan is not None
            cursor, length, urls = plan.cursor, len(plan.urls), plan.urls
            if length and rng.random() < 0.8:
                position = min(length - 1, cursor + rng.choice([0, 0, 1, 2, 5]))
                url = urls[position]
            else:
                url = rng.choice(URLS)
            planner.record_open(url, plan_id)
        else:
            planner.record_open(rng.choice(URLS), None)

    def check(self) -> None:
        """Both algorithms choose the same for a demand open, a prefetch and a warm of every url."""
        planner, pool = self.planner, self.pool()
        assert planner.choose_resident_victim(self.usable) == planner.choose_victim(pool)
        for incoming in self.rng.sample(URLS, 4):
            assert planner.choose_resident_victim(self.usable, incoming) == planner.choose_victim(
                pool, incoming
            )
            for warm in (False, True):
                new = prefetch_victim(
                    lambda i: planner.choose_resident_victim(self.usable, i),
                    planner.next_use_at,
                    incoming,
                    warm=warm,
                )
                old = prefetch_victim(
                    lambda i: planner.choose_victim(pool, i), planner.next_use_at, incoming, warm=warm
                )
                assert new == old
        assert planner.has_resident(self.usable) == bool(pool)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["belady", "belady", "lru"]))
def test_the_ordered_index_chooses_the_victim_the_linear_scan_chooses(seed: int, policy: str) -> None:
    world = World(random.Random(seed), policy)
    for _ in range(120):
        world.step()
        world.check()


def test_ties_across_slots_go_to_the_shard_first_in_store_order() -> None:
    planner = Planner(clock=lambda: 0.0)
    planner.add_plan("job", 0, 0, ["a", "x"])
    planner.add_plan("job", 1, 0, ["b", "y"])  # no slot has a pace: both lines are the same, "x" ties "y"
    for url in ["y", "x"]:
        planner.resident(url)
    assert planner.choose_victim(["y", "x"]) == "y"
    assert planner.choose_resident_victim(lambda url: True) == "y"


def test_a_pinned_farthest_shard_is_passed_over() -> None:
    planner = Planner(clock=lambda: 0.0)
    planner.add_plan("job", 0, 0, ["a", "b", "c"])
    for url in ["a", "b", "c"]:
        planner.resident(url)
    assert planner.choose_resident_victim(lambda url: url != "c") == "b"


def test_a_shard_the_cursor_passed_becomes_unplanned_and_goes_first() -> None:
    planner = Planner(clock=lambda: 0.0)
    pid = planner.add_plan("job", 0, 0, ["a", "b", "c"])
    for url in ["c", "a", "b"]:
        planner.resident(url)
    planner.record_open("b", pid)  # a jump: "a" and "b" are passed over, "c" is still ahead
    assert planner.choose_resident_victim(lambda url: True) == "a"  # never opened: least recent


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), slots=st.integers(1, 4))
def test_from_an_epoch_start_the_ordered_index_chooses_the_victim_the_linear_scan_chooses(
    seed: int, slots: int
) -> None:
    # Every shard resident and planned in this epoch and the next, every cursor at 0 (the case where each
    # shard's uses in other slots' plans are later than its first one), then reading at diverging paces.
    world = World(random.Random(seed), "belady")
    rng, planner = world.rng, world.planner
    for url in URLS:
        world.resident[url] = None
        planner.resident(url)
        planner.touch(url)
    for epoch in (0, 1):
        deal = rng.sample(URLS, len(URLS))
        for slot in range(slots):
            world.plans.append(planner.add_plan("a", slot, epoch, deal[slot::slots]))
    world.check()
    for _ in range(100):
        if rng.random() < 0.6:
            world.now += rng.choice([0.0, 0.0, 0.2, 1.0, 3.0])
            world.open()
        else:
            world.step()
        world.check()
