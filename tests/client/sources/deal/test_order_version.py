"""Resume states record the epoch order they were taken in; a state of the order before version 2 (what
shardcache wrote before the Feistel order: no `order` key) is refused with a typed error, never resumed at
the same position of a different order."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import keys, make_tars, slot_contexts
from shardcache import Dataset, ResumeStateError, merge_states
from shardcache.resume.elastic import elastic_state, origin_of
from shardcache.snapshots.store import EntryPaths
from shardcache.sources.deal.order import ORDER_KEY, ORDER_VERSION


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=6, samples=4)


def dataset(tars: list[str]) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None).map(lambda s: s)


def source_state(blob: dict[str, Any]) -> dict[str, Any]:
    node = blob["state"]["pipeline"]
    while "up" in node:
        node = node["up"]
    return node  # type: ignore[no-any-return]


def as_old_order(blob: dict[str, Any]) -> dict[str, Any]:
    """The state the previous shardcache wrote at the same position: its source state has no order key."""
    old = copy.deepcopy(blob)
    del source_state(old)[ORDER_KEY]
    return old


def test_a_sources_state_records_the_order_version(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    assert source_state(it.state_dict())[ORDER_KEY] == ORDER_VERSION == 2


def test_a_state_of_the_old_order_is_refused_when_it_loads(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    old = json.loads(json.dumps(as_old_order(it.state_dict())))
    with pytest.raises(ResumeStateError, match=r"^\[ResumeOrderVersionMismatch\] ") as caught:
        dataset(tars).load_state_dict(old)
    message = str(caught.value)
    assert "order version 1" in message and "order version 2" in message
    assert "set_epoch" in message and "shardcache version that wrote the state" in message


def test_a_state_of_another_future_order_is_refused_too(tars: list[str]) -> None:
    it = iter(dataset(tars))
    next(it)
    state = it.state_dict()
    source_state(state)[ORDER_KEY] = ORDER_VERSION + 1
    with pytest.raises(ResumeStateError, match="order version 3"):
        dataset(tars).load_state_dict(state)


def test_merged_states_of_the_old_order_are_refused(tars: list[str]) -> None:
    states = []
    for ctx in slot_contexts(2):
        it = dataset(tars).iter_context(ctx)
        next(it)
        states.append(as_old_order(it.state_dict()))
    merged = merge_states(states)
    with pytest.raises(ResumeStateError, match=r"^\[ResumeOrderVersionMismatch\] "):
        dataset(tars).load_state_dict(merged)


def test_an_elastic_origin_of_old_order_states_is_refused_when_the_source_replays_it(tars: list[str]) -> None:
    states = []
    for ctx in slot_contexts(2):
        it = dataset(tars).iter_context(ctx)
        next(it)
        states.append(as_old_order(it.state_dict())["state"] | {"slot": ctx.slot})
    ds = dataset(tars)
    origin = origin_of([(s["slot"], source_state({"state": s}), False) for s in states], 0)
    assert origin.order_version == 1
    ds.load_state_dict(elastic_state(ds.fingerprint(), origin))
    with pytest.raises(ResumeStateError, match=r"^\[ResumeOrderVersionMismatch\] elastic resume state"):
        keys(ds.iter_context(slot_contexts(3)[0]))


def test_a_state_of_the_old_order_taken_at_an_epoch_end_still_starts_the_next_epoch(tars: list[str]) -> None:
    ds = dataset(tars)
    it = iter(ds)
    keys(it)  # exhausted: the state holds no position, only the next epoch to start
    ended = it.state_dict()
    assert ended["state"] is None
    resumed = dataset(tars)
    resumed.load_state_dict(ended)
    assert sorted(keys(resumed)) == sorted(keys(dataset(tars)))


def test_a_state_of_this_order_resumes_exactly(tars: list[str]) -> None:
    it = iter(dataset(tars))
    head = [next(it)["__key__"] for _ in range(9)]
    resumed = dataset(tars)
    resumed.load_state_dict(json.loads(json.dumps(it.state_dict())))
    assert head + keys(resumed) == keys(dataset(tars))


def test_cache_parts_are_kept_apart_per_order_version(tmp_path: Path) -> None:
    # A .cache() part is one slot's share of epoch 0's order: parts an older shardcache left half built
    # (another order) must never be merged with this version's.
    entry = EntryPaths(tmp_path / "entry")
    assert entry.parts_dir(4).name == f"parts-4-order{ORDER_VERSION}"
    assert entry.part_dir(4, 1).parent == entry.parts_dir(4)
