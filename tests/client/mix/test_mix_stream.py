"""The mixing iterators over in-memory sources: exact counts, seeded order, exact resume."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from shardcache.errors import ConfigError
from shardcache.mix.stream import BLOCK, InterleaveIterator, PassStream, RecipeIterator


class _ListPass:
    def __init__(self, items: list[Any], start: int) -> None:
        self.items, self.index = items, start

    def __iter__(self) -> _ListPass:
        return self

    def __next__(self) -> Any:
        if self.index >= len(self.items):
            raise StopIteration
        self.index += 1
        return self.items[self.index - 1]


class ListSource:
    """A `PassSource` over an in-memory list: pass j is the list shuffled with seed j."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size

    def open(self, pass_index: int, state: dict[str, Any] | None) -> Iterator[Any]:
        items = [(self.name, i) for i in range(self.size)]
        random.Random(pass_index).shuffle(items)
        return _ListPass(items, 0 if state is None else state["index"])

    def state(self, iterator: Iterator[Any]) -> dict[str, Any]:
        assert isinstance(iterator, _ListPass)
        return {"index": iterator.index}


def interleave(sizes: dict[str, int], counts: list[int], seed: int = 0, epoch: int = 0) -> InterleaveIterator:
    streams = [PassStream(ListSource(n, s), limit=c) for (n, s), c in zip(sizes.items(), counts, strict=True)]
    return InterleaveIterator(streams, counts, seed=seed, epoch=epoch, slot=0)


def test_interleave_yields_exact_counts_per_source() -> None:
    out = list(interleave({"a": 50, "b": 7, "c": 3000}, [120, 30, 9000]))
    assert Counter(name for name, _ in out) == {"a": 120, "b": 30, "c": 9000}


def test_upsampled_source_covers_whole_passes_before_repeating() -> None:
    out = [i for name, i in interleave({"a": 10, "b": 100}, [25, 100]) if name == "a"]
    assert sorted(out[:10]) == list(range(10)) and sorted(out[10:20]) == list(range(10))


def test_interleave_order_repeats_for_same_seed_and_epoch_and_differs_across_epochs() -> None:
    sizes, counts = {"a": 100, "b": 100}, [100, 100]
    first = list(interleave(sizes, counts, seed=1, epoch=0))
    assert first == list(interleave(sizes, counts, seed=1, epoch=0))
    assert first != list(interleave(sizes, counts, seed=1, epoch=1))
    assert first != list(interleave(sizes, counts, seed=2, epoch=0))


@pytest.mark.parametrize("stop", [0, 1, 17, BLOCK - 1, BLOCK, BLOCK + 5, 2 * BLOCK + 100])
def test_interleave_resumes_exactly(stop: int) -> None:
    sizes, counts = {"a": 333, "b": 1000, "c": 2}, [800, 9000, 200]
    full = list(interleave(sizes, counts, seed=5, epoch=2))
    it = interleave(sizes, counts, seed=5, epoch=2)
    head = [next(it) for _ in range(stop)]
    state = json.loads(json.dumps(it.state_dict()))
    resumed = interleave(sizes, counts, seed=5, epoch=2)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_recipe_batches_have_exact_counts_and_end_with_the_main_pass() -> None:
    streams = [PassStream(ListSource("main", 100), max_passes=1), PassStream(ListSource("aux", 7))]
    batches = list(RecipeIterator(streams, [24, 8], main=0))
    assert len(batches) == 100 // 24
    for batch in batches:
        assert Counter(name for name, _ in batch) == {"main": 24, "aux": 8}
        assert [name for name, _ in batch] == ["main"] * 24 + ["aux"] * 8


@pytest.mark.parametrize("stop", [0, 1, 3])
def test_recipe_resumes_exactly(stop: int) -> None:
    def make() -> RecipeIterator:
        streams = [PassStream(ListSource("main", 100), max_passes=1), PassStream(ListSource("aux", 7))]
        return RecipeIterator(streams, [24, 8], main=0)

    full = list(make())
    it = make()
    head = [next(it) for _ in range(stop)]
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(it.state_dict())))
    assert head + list(resumed) == full


def test_source_without_samples_in_a_slot_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'empty' yields no samples"):
        list(PassStream(ListSource("empty", 0), limit=3))
