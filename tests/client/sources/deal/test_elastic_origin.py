"""An elastic resume's origin is typed in code and unchanged on disk: `ElasticOrigin.of(state).as_state()`
is the object states have always carried, and anything else is refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shardcache.errors import StateError
from shardcache.sources.deal.partition import Layout, Partitioning
from shardcache.sources.deal.pieces import ElasticOrigin, ShuffleProgress, needs_counts

# As resume.elastic.origin_of wrote it before the origin had a type (plus the epoch order's version):
# slot progress as [pos, index] or a shuffle's {taken, emitted}, a nested origin, the dataset's own shuffle.
DATASET_ORIGIN: dict[str, Any] = {
    "epoch": 2,
    "layout": {"groups": 1, "ranks": 2, "workers": 2},
    "partitioning": ["global", None, 0.0],
    "slots": {"0": [3, 5], "1": {"taken": 40, "emitted": 32}, "3": [0, 0]},
    "exhausted": [2],
    "origin": {
        "epoch": 2,
        "layout": {"groups": 1, "ranks": 4, "workers": 1},
        "partitioning": ["node", "drop", 0.25],
        "slots": {"1": [1, 0]},
        "exhausted": [],
        "origin": None,
        "order": 2,
        "shuffle": None,
        "loader": None,
    },
    "order": 2,
    "shuffle": [16, None, 7],
    "loader": None,
}

# As loader.resume wrote it for a TorchLoader with its own shuffle.
LOADER_ORIGIN: dict[str, Any] = {
    "epoch": 0,
    "layout": {"groups": 1, "ranks": 2, "workers": 3},
    "partitioning": ["global", "pad", 0.0],
    "slots": {},
    "exhausted": [],
    "origin": None,
    "order": 2,
    "shuffle": None,
    "loader": {"batch": 4, "shuffle": [32, 8, None], "ranks": {"0": [12, 4], "1": [9, 1]}},
}


@pytest.mark.parametrize("state", [DATASET_ORIGIN, LOADER_ORIGIN], ids=["dataset", "loader"])
def test_an_origin_reads_and_writes_back_the_same_json(state: dict[str, Any]) -> None:
    assert json.dumps(ElasticOrigin.of(state).as_state()) == json.dumps(state)


def test_an_origin_without_an_order_version_is_of_the_first_order() -> None:
    legacy = {k: v for k, v in DATASET_ORIGIN.items() if k != "order"}
    assert ElasticOrigin.of(legacy).order_version == 1


def test_an_origin_carries_typed_progress() -> None:
    origin = ElasticOrigin.of(DATASET_ORIGIN)
    assert origin.layout == Layout(1, 2, 2)
    assert origin.partitioning == Partitioning("global", None, 0.0)
    assert origin.slots[0] == (3, 5)
    assert origin.slots[1] == ShuffleProgress(taken=40, emitted=32)
    assert origin.exhausted == frozenset({2})
    assert origin.origin is not None and origin.origin.partitioning == Partitioning("node", "drop", 0.25)


def test_counts_are_needed_for_a_shuffles_progress_or_an_even_cut_anywhere_in_the_chain() -> None:
    plain = {**DATASET_ORIGIN, "slots": {"0": [1, 2]}, "origin": None}
    assert not needs_counts(ElasticOrigin.of(plain))
    assert needs_counts(ElasticOrigin.of(DATASET_ORIGIN))  # slot 1's shuffle progress
    assert needs_counts(ElasticOrigin.of({**plain, "origin": DATASET_ORIGIN["origin"]}))  # even="drop" below
    assert needs_counts(ElasticOrigin.of(LOADER_ORIGIN))


@pytest.mark.parametrize(
    "broken",
    [
        {k: v for k, v in DATASET_ORIGIN.items() if k != "slots"},
        {**DATASET_ORIGIN, "layout": {"groups": 1}},
        {**DATASET_ORIGIN, "slots": {"0": "three"}},
        {**LOADER_ORIGIN, "loader": {"batch": 4}},
    ],
    ids=["no-slots", "short-layout", "bad-progress", "short-loader"],
)
def test_a_malformed_origin_is_refused_naming_the_field(broken: dict[str, Any]) -> None:
    with pytest.raises(StateError, match="resume state field 'origin'"):
        ElasticOrigin.of(broken)
