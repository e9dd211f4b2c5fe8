"""The Belady policy, replayed on recorded traces without prefetch, fetches exactly as often as offline MIN.

What is proved (for unit-sized shards, demand fetches only):

* Full knowledge (every plan of every epoch registered up front): the planner's fetch count equals the
  offline MIN optimum, both for one global plan and for several slots whose opens interleave at steady but
  different speeds. Exactness needs the planner's estimated times to be in the true global order, which holds
  once each slot's pace is observed (two opens per slot; with equal speeds, one open per slot is enough since
  a slot without a pace borrows the median). The traces are drawn so that no eviction happens earlier.
* Plan-window knowledge (each slot registers its current and next epoch when the epoch starts and deletes the
  finished one, as the client does): the planner equals the offline MIN that knows only what the plans tell,
  unknown next uses counting as "never" and those going least-recent first.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness import belady_sim as sim
from shardcached.planning import Planner

Access = sim.Access


@dataclass(frozen=True)
class Timed:
    """An access with the clock time at which its slot opens it."""

    time: float
    access: Access


def replay(timed: Sequence[Timed], capacity: int, lookahead_epochs: int | None) -> int:
    """Drive the real Planner like the daemon does for demand opens; return the number of fetches."""
    now = [0.0]
    planner = Planner(policy="belady", stale_after_s=1e9, clock=lambda: now[0])
    plans_by_slot: dict[Hashable, dict[int, list[str]]] = {}
    for item in timed:
        a = item.access
        plans_by_slot.setdefault(a.slot, {}).setdefault(a.epoch, []).append(a.url)
    ids: dict[tuple[Hashable, int], str] = {}

    def register(slot: Hashable, epoch: int) -> None:
        if epoch in plans_by_slot[slot] and (slot, epoch) not in ids:
            ids[(slot, epoch)] = planner.add_plan("job", hash(slot), epoch, plans_by_slot[slot][epoch])

    for slot, epochs in plans_by_slot.items():
        first = min(epochs)
        for epoch in epochs:
            if lookahead_epochs is None or epoch <= first + lookahead_epochs:
                register(slot, epoch)
    current: dict[Hashable, int] = {}
    resident: set[str] = set()
    fetches = 0
    for item in timed:
        a = item.access
        now[0] = item.time
        if lookahead_epochs is not None and current.get(a.slot) != a.epoch:
            for ahead in range(lookahead_epochs + 1):
                register(a.slot, a.epoch + ahead)
            old = ids.pop((a.slot, a.epoch - 1), None)
            if old is not None:
                assert planner.delete_plan(old)
        current[a.slot] = a.epoch
        planner.record_open(a.url, ids[(a.slot, a.epoch)])
        if a.url not in resident:
            fetches += 1
            if len(resident) >= capacity:
                victim = planner.choose_victim(resident, incoming=None)
                assert victim in resident
                resident.remove(victim)
                planner.forget(victim)
            resident.add(a.url)
    return fetches


@st.composite
def slot_orders(draw: st.DrawFn, max_slots: int = 4) -> tuple[int, list[list[list[str]]], int]:
    """(universe size, orders[slot][epoch] -> urls, capacity); every slot reads the same count per epoch."""
    universe = draw(st.integers(2, 10))
    slots = draw(st.integers(1, max_slots))
    epochs = draw(st.integers(1, 4))
    length = draw(st.integers(1, 5))
    url = st.integers(0, universe - 1).map(lambda i: f"s3://b/shard-{i:02d}.tar")
    orders = [
        [draw(st.lists(url, min_size=length, max_size=length)) for _ in range(epochs)] for _ in range(slots)
    ]
    capacity = draw(st.integers(1, universe))
    return universe, orders, capacity


def round_robin(orders: list[list[list[str]]]) -> list[Timed]:
    """Slots take turns, one open per clock tick: the global order is the time order."""
    timed: list[Timed] = []
    for epoch in range(len(orders[0])):
        for i in range(len(orders[0][epoch])):
            for slot, per_epoch in enumerate(orders):
                timed.append(Timed(float(len(timed)), Access(slot, epoch, per_epoch[epoch][i])))
    return timed


def paced(orders: list[list[list[str]]], periods: list[int]) -> list[Timed]:
    """Slot s opens every periods[s] ticks at phase s/8 (exact in binary floats, never colliding)."""
    timed: list[Timed] = []
    for slot, per_epoch in enumerate(orders):
        flat = [(epoch, url) for epoch, urls in enumerate(per_epoch) for url in urls]
        for n, (epoch, url) in enumerate(flat):
            timed.append(Timed(slot / 8 + n * periods[slot], Access(slot, epoch, url)))
    return sorted(timed, key=lambda t: t.time)


def first_eviction_index(timed: Sequence[Timed], capacity: int) -> int:
    seen: set[str] = set()
    for index, item in enumerate(timed):
        seen.add(item.access.url)
        if len(seen) > capacity:
            return index
    return len(timed)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


@SETTINGS
@given(st.lists(st.integers(0, 9).map(lambda i: f"u{i}"), min_size=1, max_size=60), st.integers(1, 10))
def test_one_global_plan_fetches_exactly_min(urls: list[str], capacity: int) -> None:
    timed = [Timed(float(i), Access(0, 0, url)) for i, url in enumerate(urls)]
    trace = [t.access for t in timed]
    assert replay(timed, capacity, None) == sim.min_fetches(trace, capacity)


@SETTINGS
@given(slot_orders())
def test_round_robin_slots_over_all_epochs_fetch_exactly_min(
    case: tuple[int, list[list[list[str]]], int],
) -> None:
    _, orders, capacity = case
    assume(capacity >= len(orders))  # the first eviction comes after every slot has opened once
    timed = round_robin(orders)
    trace = [t.access for t in timed]
    assert replay(timed, capacity, None) == sim.min_fetches(trace, capacity)


@SETTINGS
@given(slot_orders(max_slots=3), st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_slots_at_different_speeds_fetch_exactly_min_once_paces_are_known(
    case: tuple[int, list[list[list[str]]], int], periods: list[int]
) -> None:
    _, orders, capacity = case
    timed = paced(orders, periods)
    second_opens = []
    for slot in range(len(orders)):
        times = [i for i, t in enumerate(timed) if t.access.slot == slot]
        second_opens.append(times[min(1, len(times) - 1)])
    assume(first_eviction_index(timed, capacity) > max(second_opens))
    trace = [t.access for t in timed]
    assert replay(timed, capacity, None) == sim.min_fetches(trace, capacity)


@SETTINGS
@given(slot_orders())
def test_current_and_next_epoch_plans_fetch_exactly_the_min_of_what_the_plans_tell(
    case: tuple[int, list[list[list[str]]], int],
) -> None:
    _, orders, capacity = case
    assume(capacity >= len(orders))
    timed = round_robin(orders)
    trace = [t.access for t in timed]
    assert replay(timed, capacity, 1) == sim.min_fetches(trace, capacity, lookahead_epochs=1)


@SETTINGS
@given(slot_orders())
def test_belady_never_fetches_more_than_lru(case: tuple[int, list[list[list[str]]], int]) -> None:
    _, orders, capacity = case
    assume(capacity >= len(orders))
    timed = round_robin(orders)
    trace = [t.access for t in timed]
    assert replay(timed, capacity, None) <= sim.lru_fetches(trace, capacity)
