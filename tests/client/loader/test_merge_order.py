"""The merge order an elastic resume replays is the order `MergeNode` really hands samples on."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from shardcache.loader.merge import MergeNode, merged_order
from shardcache.loader.stream import Item
from shardcache.sources.deal import pieces


def worker_items(worker: int, size: int, batch: int) -> list[Item]:
    """A worker's payloads of `batch` samples (the last smaller), each sample named (worker, index), then
    its end marker."""
    items: list[Item] = []
    for start in range(0, size, batch):
        payload = [(worker, j) for j in range(start, min(size, start + batch))]
        items.append((worker, payload, {"at": start}, False, None))
    items.append((worker, None, {"at": size}, True, None))
    return items


@pytest.mark.parametrize(
    ("sizes", "batch"), [([5, 12, 0], 4), ([7, 7, 7], 3), ([1], 2), ([0, 0], 1), ([9, 2, 4, 13], 5)]
)
def test_merged_order_is_the_order_the_merge_hands_samples_on(sizes: list[int], batch: int) -> None:
    streams = [worker_items(w, size, batch) for w, size in enumerate(sizes)]
    # The DataLoader hands items over in its own order (here: the last worker's first, round-robin after):
    # the merge must not depend on it.
    arrival = [item for group in itertools.zip_longest(*reversed(streams)) for item in group if item]

    def open_loader(states: object, exhausted: object) -> Iterator[Item]:
        return iter(arrival)

    merge = MergeNode(open_loader, num_workers=len(sizes))
    handed = [sample for payload in merge for sample in payload]
    assert handed == list(merged_order(sizes, batch))


def test_the_loader_registers_its_merge_order_for_the_elastic_replay() -> None:
    assert pieces._MERGE_ORDER == [merged_order]
