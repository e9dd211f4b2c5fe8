"""Room made right after a plan is dropped: the refile it needs runs in pieces, the loop free between them.

A dropped plan's resident shards must be refiled before any eviction decision (nextuse.py). A decision would
settle them itself in one loop step (1-1.5 s at 10^5 resident shards, every hit on the node waiting); the
open that needs room awaits `indexing.refiled` instead, so other requests run between the pieces, and the
victim is still exactly the one an eager drop leads to.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from prometheus_client import CollectorRegistry

from shardcached.metrics import Metrics
from shardcached.planning import Planner, refiled
from shardcached.storage import Entry, Space, Store

SIZE = 10
URLS = [f"s3://b/{i:03d}.tar" for i in range(240)]


def planner_with_plans(clock: list[float], stale_after_s: float = 1e9) -> tuple[Planner, list[str]]:
    """A slot with plans for epochs 0 (every url) and 1 (the first 200), each shuffled."""
    rng = random.Random(3)
    planner = Planner(prefetch_depth=0, clock=lambda: clock[0], stale_after_s=stale_after_s)
    plans = [planner.add_plan("job", 0, epoch, rng.sample(URLS[:n], n)) for epoch, n in ((0, 240), (1, 200))]
    return planner, plans


def full_space(tmp_path: Path, planner: Planner) -> tuple[Space, Store]:
    """A store holding 220 of the urls, full to its capacity, watched by `planner`."""
    tmp_path.mkdir(exist_ok=True)
    store = Store(tmp_path, capacity=220 * SIZE)
    space = Space(
        store,
        planner,
        Metrics(CollectorRegistry()),
        evict_wait_s=1.0,
        clock=lambda: 0.0,
        closing=lambda: False,
        refile_piece=50,
    )
    for i, url in enumerate(random.Random(5).sample(URLS, 220)):
        path = tmp_path / f"{i:03d}.data"
        path.write_bytes(b"x" * SIZE)
        store.add(Entry(key=f"{i:03d}", url=url, version="v", size=SIZE, path=path))
    return space, store


async def make_room_counting_loop_turns(space: Space) -> int:
    """`make_room` for one more shard, and how many loop turns a concurrent task got meanwhile."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    await space.make_room(SIZE, "s3://b/new.tar", demand=True)
    done = True
    await ticking
    return turns


def test_making_room_after_a_drop_lets_other_requests_run_between_refile_pieces(tmp_path: Path) -> None:
    planner, plans = planner_with_plans([0.0])
    space, _ = full_space(tmp_path, planner)
    assert planner.drop_plan(plans[0])  # its 220 resident shards to refile: five pieces of 50
    turns = asyncio.run(make_room_counting_loop_turns(space))
    assert turns >= 3
    assert not planner.refile_pending


def test_the_victim_after_awaiting_the_refile_is_the_one_an_eager_drop_chooses(tmp_path: Path) -> None:
    lazy, lazy_plans = planner_with_plans([0.0])
    eager, eager_plans = planner_with_plans([0.0])
    space, store = full_space(tmp_path / "lazy", lazy)
    _, eager_store = full_space(tmp_path / "eager", eager)
    before = set(store.by_url)
    lazy.drop_plan(lazy_plans[0])
    eager.delete_plan(eager_plans[0])
    expected = eager.choose_victim(list(eager_store.by_url))  # the linear reference, in store order
    asyncio.run(space.make_room(SIZE, "s3://b/new.tar", demand=True))
    assert before - set(store.by_url) == {expected}


def test_a_stale_slot_is_dropped_and_refiled_before_the_decision_not_inside_it(tmp_path: Path) -> None:
    clock = [0.0]
    planner, _ = planner_with_plans(clock, stale_after_s=5.0)
    space, _ = full_space(tmp_path, planner)
    clock[0] = 10.0  # the slot went stale: the decision would drop its plans and settle them in one step
    turns = asyncio.run(make_room_counting_loop_turns(space))
    assert turns >= 3
    assert planner.describe() == []  # both plans went, and their shards were refiled in pieces


def test_refiled_returns_without_yielding_when_nothing_is_pending() -> None:
    planner, _ = planner_with_plans([0.0])
    waiting = refiled(planner)
    try:
        waiting.send(None)
    except StopIteration:
        return
    raise AssertionError("refiled yielded to the loop with nothing to refile")
