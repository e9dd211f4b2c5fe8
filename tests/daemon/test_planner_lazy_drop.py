"""A dropped plan's resident shards are refiled lazily, and no decision ever sees the half-dropped state.

`Planner.drop_plan` (a DELETE, a replaced plan, a stale slot) only queues the shards the plan owned; its
resident shards are refiled by `refile_more` in pieces (the indexer's background steps), and every decision
settles what is still pending first. So a decision taken at any moment equals the linear reference
(`choose_victim`), pieces of refiling and unindexing interleaved with everything else; and the pending work,
left alone, finishes by itself into exactly the state an eager drop leaves.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shardcached.planning import PlanIndexer, Planner
from tests.daemon.test_planner_resident_victim import URLS, World


class LazyWorld(World):
    """`World` whose plans leave as the daemon drops them (`drop_plan`, `retire_stale`), their refiling and
    unindexing done in random pieces between the other operations, and replaced by re-registration."""

    def step(self) -> None:
        rng, planner = self.rng, self.planner
        op = rng.randrange(14)
        if op == 10 and self.plans:
            planner.drop_plan(self.plans.pop(rng.randrange(len(self.plans))))
        elif op == 11:
            planner.refile_more(rng.choice([1, 1, 2, 5]))
        elif op == 12:
            planner.unindex_more(rng.choice([1, 3, 10]))
        elif op == 13:
            if rng.random() < 0.5:
                planner.retire_stale()
            else:  # a plan for an epoch the slot has: the old one is dropped and replaced
                urls = [rng.choice(URLS) for _ in range(rng.randrange(0, 12))]
                plan, fresh = planner.begin_plan(rng.choice("ab"), rng.randrange(3), rng.randrange(4), urls)
                if fresh:
                    planner.index_more(plan, len(urls))
                self.plans.append(plan.id)
        else:
            super().step()


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), policy=st.sampled_from(["belady", "belady", "lru"]))
def test_a_decision_with_refiles_pending_chooses_what_the_linear_scan_chooses(seed: int, policy: str) -> None:
    world = LazyWorld(random.Random(seed), policy)
    for _ in range(150):
        world.step()
        if world.rng.random() < 0.3:  # most steps leave the pending work pending for the next ones
            world.check()


def resident_planner(stale_after_s: float = 1e9) -> tuple[Planner, list[str], list[str]]:
    """A slot with plans for epochs 0 (all 40 urls) and 1 (30 of them), shuffled; 30 urls resident."""
    rng = random.Random(7)
    urls = [f"s3://b/{i:02d}.tar" for i in range(40)]
    planner = Planner(prefetch_depth=0, clock=lambda: 0.0, stale_after_s=stale_after_s)
    plans = [planner.add_plan("job", 0, epoch, rng.sample(urls, n)) for epoch, n in ((0, 40), (1, 30))]
    for url in rng.sample(urls, 30):
        planner.resident(url)
    return planner, plans, urls


def index_state(planner: Planner) -> tuple[dict[str, tuple[object, ...]], dict[str, int | None]]:
    """Everything the next-use index keeps, comparable across two planners: each resident url's owner
    (job, slot, epoch of the plan) and position, or its idle key (a url queued for a refile has neither)."""
    index, table = planner._index, planner.table
    owners: dict[str, tuple[object, ...]] = {}
    idle: dict[str, int | None] = {}
    for uid in index.resident_ids().tolist():
        owned = index.owned_by(uid)
        if owned is None:
            if index.idle_key(uid) is not None:  # else queued: its owner was dropped
                idle[table.url(uid)] = index.idle_key(uid)
        else:
            plan = planner._uses.plan_at(owned[0])
            assert plan is not None
            owners[table.url(uid)] = (plan.chain.job, plan.chain.slot, plan.epoch, owned[1])
    return owners, idle


def test_a_drop_refiles_nothing_until_asked() -> None:
    planner, plans, _ = resident_planner()
    before = index_state(planner)
    assert planner.drop_plan(plans[0])
    assert planner.refile_pending
    owners, idle = index_state(planner)
    assert idle == before[1]  # none refiled: the shards only the dropped plan held are not idle yet
    assert all(owner[2] != 0 for owner in owners.values())  # only queued: filed under no plan meanwhile


def test_the_pending_refile_finishes_by_itself_into_the_eager_state() -> None:
    lazy, lazy_plans, _ = resident_planner()
    eager, eager_plans, _ = resident_planner()
    indexer = PlanIndexer(lazy, chunk=3, refile_chunk=2)
    lazy.drop_plan(lazy_plans[0])
    eager.delete_plan(eager_plans[0])
    while indexer.step():
        pass
    assert not lazy.refile_pending and not lazy.unindex_pending
    assert index_state(lazy) == index_state(eager)


def test_a_decision_right_after_a_drop_equals_the_eager_one() -> None:
    lazy, lazy_plans, urls = resident_planner()
    eager, eager_plans, _ = resident_planner()
    lazy.drop_plan(lazy_plans[0])
    eager.delete_plan(eager_plans[0])
    lazy.refile_more(3)  # part of it done
    resident = lazy.table.urls(lazy._index.resident_ids())  # in store order
    victim = lazy.choose_resident_victim(lambda url: url in resident)
    assert victim == eager.choose_resident_victim(lambda url: url in resident)
    assert victim == eager.choose_victim(resident)
    assert not lazy.refile_pending  # the decision settled it
    assert index_state(lazy) == index_state(eager)


def test_a_second_drop_of_the_same_chain_while_the_first_is_pending() -> None:
    lazy, lazy_plans, _ = resident_planner()
    eager, eager_plans, _ = resident_planner()
    lazy.drop_plan(lazy_plans[0])
    lazy.refile_more(4)
    lazy.drop_plan(lazy_plans[1])
    eager.delete_plan(eager_plans[0])
    eager.delete_plan(eager_plans[1])
    while lazy.refile_more(1) is False:
        pass
    assert index_state(lazy) == index_state(eager)
    assert not index_state(lazy)[0]  # no plan left: every resident shard is idle


def test_a_replaced_plan_dropped_again_while_its_refile_is_pending_is_refiled_again() -> None:
    urls = [f"s3://b/{i:02d}.tar" for i in range(40)]
    lazy = Planner(prefetch_depth=0, clock=lambda: 0.0, stale_after_s=1e9)
    lazy.add_plan("job", 0, 0, urls)
    eager = Planner(prefetch_depth=0, clock=lambda: 0.0, stale_after_s=1e9)  # no plan at all
    for planner in (lazy, eager):
        for url in urls[:30]:
            planner.resident(url)
    replacement, _ = lazy.begin_plan("job", 0, 0, list(reversed(urls)))  # drops the first plan
    lazy.index_more(replacement, 40)
    lazy.refile_more(10)  # the walk passes entries that are the replacement's, live until now
    lazy.drop_plan(replacement.id)
    lazy.refile_more(10**6)
    assert index_state(lazy) == index_state(eager)


def test_remove_and_add_of_a_shard_with_a_pending_refile() -> None:
    lazy, lazy_plans, urls = resident_planner()
    eager, eager_plans, _ = resident_planner()
    lazy.drop_plan(lazy_plans[0])
    eager.delete_plan(eager_plans[0])
    gone, back = lazy.table.urls(lazy._index.resident_ids())[:2]
    for planner in (lazy, eager):
        planner.gone(gone)
        planner.gone(back)
        planner.resident(back)
    assert lazy.refile_pending
    lazy.refile_more(10**6)
    assert index_state(lazy) == index_state(eager)


def test_a_stale_slots_plans_are_refiled_before_the_decision_that_retired_them() -> None:
    now = [0.0]
    planner = Planner(prefetch_depth=0, clock=lambda: now[0], stale_after_s=5.0)
    planner.add_plan("job", 0, 0, ["a", "b", "c"])
    for url in ("a", "b", "c"):
        planner.resident(url)
    planner.touch("c")
    planner.touch("a")
    planner.touch("b")
    now[0] = 10.0  # the slot goes stale in the decision itself (`maybe_expire`): every shard is idle then
    assert planner.choose_resident_victim(lambda url: True) == "c"


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_settle_and_pieces_leave_the_state_an_eager_delete_leaves(seed: int) -> None:
    states = []
    for mode in ("settle", "pieces", "eager"):
        rng = random.Random(seed)
        now = [0.0]
        planner = Planner(prefetch_depth=0, clock=lambda now=now: now[0], stale_after_s=1e9)  # type: ignore[misc]
        plans = []
        for _ in range(rng.randrange(2, 8)):
            urls = [rng.choice(URLS) for _ in range(rng.randrange(0, 16))]
            plans.append(planner.add_plan(rng.choice("ab"), rng.randrange(2), rng.randrange(3), urls))
        for url in rng.sample(URLS, 16):
            planner.resident(url)
        for _ in range(rng.randrange(0, 6)):
            plan_id = rng.choice(plans)
            if planner.has_plan(plan_id):
                now[0] += rng.choice([0.0, 1.0, 2.5])
                planner.record_open(rng.choice(URLS), plan_id)
        for plan_id in rng.sample(plans, rng.randrange(1, len(plans) + 1)):
            if mode == "eager":  # refiles url by url (`replan`) as it unindexes the plan
                planner._registry.delete_plan(plan_id)
            else:
                planner.drop_plan(plan_id)
        if mode == "settle":
            planner._index.settle()
        else:
            while not planner.refile_more(1):
                pass
        index = planner._index
        for uid in index.resident_ids().tolist():  # an owned entry is one of the url's next uses
            owned = index.owned_by(uid)
            if owned is not None:
                plan = planner._uses.plan_at(owned[0])
                assert plan is not None and plan.first_at_or_after(uid, plan.cursor) == owned[1]
                assert index.idle_key(uid) is None
            else:
                assert index.idle_key(uid) is not None
        states.append(index_state(planner))
    assert states[0] == states[1]
    # Owners may differ from the eager drops': a plan's times change as the others of its slot go, and any
    # owner is correct (nextuse.py); which shards are idle, and their order, may not.
    assert states[0][1] == states[2][1] and states[0][0].keys() == states[2][0].keys()
