"""Mini epochs (seed 001): an epoch's shard order cut into consecutive chunks, each a Dataset."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.pipelines import keys, make_tars, slot_contexts
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError


@pytest.fixture
def dataset(tmp_path: Path) -> Dataset:
    return Dataset.from_source("tars", make_tars(tmp_path / "tars", 10, 3), daemon=None)


def chunk_shards(chunk: Dataset) -> list[str]:
    return [ref.url for ref in chunk.source.shards]


def test_chunks_are_consecutive_slices_of_the_epoch_order(dataset: Dataset) -> None:
    dataset.set_epoch(3)
    urls = [dataset.source.shards[i].url for i in dataset.epoch_shard_order()]
    chunks = dataset.mini_epochs(4)
    assert [len(c.source.shards) for c in chunks] == [4, 4, 2]
    assert [u for c in chunks for u in chunk_shards(c)] == urls


def test_union_of_chunks_is_exactly_the_epoch(dataset: Dataset) -> None:
    dataset.set_epoch(1)
    chunked = [k for chunk in dataset.mini_epochs(3) for k in keys(chunk)]
    assert sorted(chunked) == sorted(keys(dataset))
    assert len(chunked) == len(set(chunked))


def test_union_over_slots_and_chunks_is_exactly_the_epoch(dataset: Dataset) -> None:
    chunks = dataset.mini_epochs(4, num_workers=2)
    seen = [
        k for chunk in chunks for ctx in slot_contexts(2, workers=2) for k in keys(chunk.iter_context(ctx))
    ]
    assert sorted(seen) == sorted(keys(dataset))
    assert len(seen) == len(set(seen))


def test_chunks_keep_the_stages(dataset: Dataset) -> None:
    chunks = dataset.map(len).batch(2).mini_epochs(5)
    assert all(c.stages == dataset.map(len).batch(2).stages for c in chunks)
    assert all(isinstance(b, list) and len(b) <= 2 for b in chunks[0])


def test_chunking_follows_the_epoch(dataset: Dataset) -> None:
    def chunking(epoch: int) -> list[list[str]]:
        dataset.set_epoch(epoch)
        return [chunk_shards(c) for c in dataset.mini_epochs(5)]

    assert chunking(2) == chunking(2)
    assert chunking(0) != chunking(1)


def test_chunks_iterate_at_the_dataset_epoch(dataset: Dataset) -> None:
    dataset.set_epoch(4)
    assert all(chunk.epoch == 4 for chunk in dataset.mini_epochs(5))


def test_chunk_with_fewer_shards_than_slots_is_a_config_error(tmp_path: Path) -> None:
    ctx = RuntimeContext(rank=0, world_size=2)
    ds = Dataset.from_source("tars", make_tars(tmp_path / "t", 5, 1), daemon=None, context=ctx)
    with pytest.raises(ConfigError, match="chunk 2 has 1 shards but 2 slots"):
        ds.mini_epochs(2)
    with pytest.raises(ConfigError, match=r"2 data-parallel ranks × 4 workers"):
        ds.mini_epochs(5, num_workers=4)


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_bad_shards_per_chunk_is_a_config_error(dataset: Dataset, value: object) -> None:
    with pytest.raises(ConfigError, match="shards_per_chunk"):
        dataset.mini_epochs(value)  # type: ignore[arg-type]


def test_resampling_dataset_is_refused(tmp_path: Path) -> None:
    ds = Dataset.from_source("tars", make_tars(tmp_path / "r", 2, 1), daemon=None, resample=True)
    with pytest.raises(ConfigError, match="finite epoch"):
        ds.mini_epochs(1)


def test_cached_pipeline_is_refused(dataset: Dataset, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="one cache per chunk"):
        dataset.cache(cache_dir=str(tmp_path / "c")).mini_epochs(2)
