"""A reader plans its share of the epoch, not the dataset (issue 25)."""

from __future__ import annotations

from typing import Any

import pytest

from shardcache import RuntimeContext
from shardcache.memo import IdentityMemo
from shardcache.shards import ShardRef
from shardcache.sources.deal.order import permutation
from shardcache.sources.deal.partition import ShardUnits, Unit
from shardcache.sources.deal.schedule import PlanTracker, job_id, slot_order, source_job


def whole_order_slot(n: int, ctx: RuntimeContext, epoch: int, round_index: int, shuffle: bool) -> list[int]:
    """A slot's units read off the whole permutation: every position, filtered."""
    order = permutation(n, ctx.seed, epoch, round_index) if shuffle else list(range(n))
    return [u for i, u in enumerate(order) if (round_index * n + i) % ctx.total_slots == ctx.slot]


@pytest.mark.parametrize("n", [1, 7, 100, 1031])
@pytest.mark.parametrize("world", [1, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_a_slots_order_is_its_stride_of_the_whole_order(n: int, world: int, shuffle: bool) -> None:
    for rank in range(world):
        ctx = RuntimeContext(rank=rank, world_size=world, seed=11)
        for epoch, round_index in ((0, 0), (3, 0), (1, 2)):
            want = whole_order_slot(n, ctx, epoch, round_index, shuffle)
            assert slot_order(n, ctx, epoch, round_index, shuffle) == want


def test_permutation_returns_a_new_list_each_call() -> None:
    first = permutation(50, 1, 2)
    first.pop()
    assert sorted(permutation(50, 1, 2)) == list(range(50))


def test_shard_units_read_as_the_list_of_whole_shard_units() -> None:
    refs = (ShardRef("a", num_samples=3), ShardRef("b"), ShardRef("c", num_samples=1))
    units = ShardUnits(refs)
    want = [Unit(ref, count=ref.num_samples) for ref in refs]
    assert len(units) == 3
    assert list(units) == want
    assert [units[i] for i in range(3)] == want
    assert units[-1] == want[-1]
    assert units[1:] == want[1:]


def test_the_job_of_a_shard_list_is_its_hash_and_memoised_per_list() -> None:
    shards = tuple(ShardRef(f"/data/{i}.tar") for i in range(10))
    assert source_job(None, shards, 3) == job_id([ref.url for ref in shards], 3)
    assert source_job(None, shards, 4) == job_id([ref.url for ref in shards], 4)
    assert source_job("mine", shards, 3) == "mine"


def test_an_identity_memo_computes_once_per_object_and_key() -> None:
    memo: IdentityMemo[int] = IdentityMemo(size=2)
    calls: list[int] = []
    a, b = [1], [1]

    def compute(value: int) -> int:
        calls.append(value)
        return value

    assert memo.get(a, "k", lambda: compute(1)) == 1
    assert memo.get(a, "k", lambda: compute(2)) == 1
    assert memo.get(b, "k", lambda: compute(3)) == 3  # equal but another object
    assert calls == [1, 3]


class RefusingClient:
    """A daemon client whose next-epoch registration fails (what `register_plan` raises for a bad plan)."""

    generation = 0

    def register_plan(
        self, job: str, slot: int, epoch: int, urls: Any, *, ahead: bool = False, immutable: bool = False
    ) -> str:
        if ahead:
            raise ValueError(f"plan for epoch {epoch} refused")
        return f"plan-{epoch}"

    def delete_plan(self, plan_id: str) -> None:
        pass


def test_an_error_announcing_the_next_plan_is_raised_in_the_iterating_thread() -> None:
    tracker = PlanTracker(RefusingClient(), "job", 0)  # type: ignore[arg-type]
    assert tracker.start(0, ["a"], lambda: ["b"]) == "plan-0"
    with pytest.raises(ValueError, match="epoch 1 refused"):
        tracker.finish()
