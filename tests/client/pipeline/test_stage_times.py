"""Time per stage, measured where it is spent: read, each stage by kind and position, collate (issue 27).

Sleeps are the workload only: the assertions are that the slow stage has the largest share, never a time.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from harness.start_methods import loader_workers
from shardcache import Dataset, TorchLoader
from shardcache.pipeline.iteration import PipelineIterator
from shardcache.pipeline.stage_times import STAGE_TIMES_ENV, StageStats, TimedNode

SAMPLES = 4 * 8  # the `local_shards` fixture: four shards of eight samples


def slow(sample: Any) -> Any:
    time.sleep(0.005)
    return sample


def fast(sample: Any) -> Any:
    return sample


def largest(stats: StageStats) -> str:
    return max(stats.seconds.items(), key=lambda part: part[1])[0]


def test_a_slow_map_gets_the_time_not_the_read(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(slow)
    assert sum(1 for _ in ds) == SAMPLES
    assert largest(ds.stats()) == "map"


def test_parts_are_named_by_kind_and_position_and_titled_with_the_function(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None)
    ds = ds.map(slow).map(fast).shuffle(8).batch(4)
    assert sum(1 for _ in ds) == SAMPLES // 4
    stats = ds.stats()
    assert list(stats.seconds) == ["read", "map[0]", "map[1]", "shuffle", "batch"]
    assert stats.times.titles == ("read", "map[0] slow", "map[1] fast", "shuffle", "batch")
    assert largest(stats) == "map[0]"
    assert str(stats).startswith("read ")
    assert "map[0] slow" in str(stats) and str(stats).endswith("%") and "trainer waited" in str(stats)


def test_exclusive_times_add_up_to_the_time_spent_pulling_the_last_stage(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(slow).shuffle(4).batch(2)
    it = iter(ds)
    assert isinstance(it, PipelineIterator)
    list(it)
    assert it.clock is not None
    top_inclusive = it.clock.totals[-1] / 1e9  # the outermost node's next() calls, everything below included
    assert sum(it.stage_times().seconds) == pytest.approx(top_inclusive, rel=1e-9)
    assert all(seconds >= 0 for seconds in it.stage_times().seconds)
    assert sum(ds.stats().fractions.values()) == pytest.approx(1.0)


def test_stage_times_do_not_change_resume_states(local_shards, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def state_after(count: int) -> dict[str, Any]:
        ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast).shuffle(8)
        it = iter(ds)
        for _ in range(count):
            next(it)
        return ds.state_dict()

    timed = state_after(5)
    monkeypatch.setenv(STAGE_TIMES_ENV, "0")
    assert state_after(5) == timed


def test_a_state_taken_with_stage_times_resumes_the_same_samples(local_shards) -> None:  # type: ignore[no-untyped-def]
    def dataset() -> Dataset:
        return Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast).shuffle(8)

    whole = [sample["__key__"] for sample in dataset()]
    ds = dataset()
    it = iter(ds)
    head = [next(it)["__key__"] for _ in range(11)]
    resumed = dataset()
    resumed.load_state_dict(ds.state_dict())
    assert head + [sample["__key__"] for sample in resumed] == whole


def test_stats_before_any_iteration_are_empty(local_shards) -> None:  # type: ignore[no-untyped-def]
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None)
    assert ds.stats() == StageStats()
    assert str(ds.stats()) == "no stage times; trainer waited 0%"


def test_turning_stage_times_off_leaves_the_chain_untimed(local_shards, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(STAGE_TIMES_ENV, "0")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(slow)
    it = iter(ds)
    assert isinstance(it, PipelineIterator)
    assert not isinstance(it.node, TimedNode)
    assert sum(1 for _ in it) == SAMPLES
    assert ds.stats().seconds == {}


def test_a_torch_loader_sums_its_workers_times_with_their_collate(local_shards, loader_mode) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(slow).shuffle(4)
    loader = TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=list, **loader_workers(loader_mode))
    assert sum(len(batch) for batch in loader) == SAMPLES
    stats = loader.stats()
    loader.close()
    assert stats.workers == 2
    assert list(stats.seconds) == ["read", "map", "shuffle", "collate"]
    assert largest(stats) == "map"
    assert 0 < stats.waited_fraction <= 1


def test_a_torch_loader_without_workers_times_its_pipeline_too(local_shards) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(slow)
    loader = TorchLoader(ds, num_workers=0, batch_size=4)
    assert sum(1 for _ in loader) == SAMPLES // 4
    stats = loader.stats()
    assert list(stats.seconds) == ["read", "map", "collate"]
    assert largest(stats) == "map"


def test_turning_stage_times_off_reaches_the_workers(local_shards, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    monkeypatch.setenv(STAGE_TIMES_ENV, "off")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast)
    loader = TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=list)
    assert sum(len(batch) for batch in loader) == SAMPLES
    stats = loader.stats()
    loader.close()
    assert stats.seconds == {}
    assert stats.elapsed_s > 0  # the trainer's wait is still measured


def test_a_torch_loaders_loader_side_stages_are_timed_apart_from_its_workers(local_shards) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast)
    loader = TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=list).unbatch().map(slow).batch(8)
    assert sum(len(batch) for batch in loader) == SAMPLES
    stats = loader.stats()
    loader.close()
    assert list(stats.seconds) == ["read", "map", "collate"]  # the workers' parts alone
    assert list(stats.loader.names) == ["loader.unbatch", "loader.map", "loader.batch"]
    assert max(stats.loader.as_dict().items(), key=lambda part: part[1])[0] == "loader.map"
    # The loader-side stages ran inside the trainer's wait: their share of its time is within it.
    assert sum(stats.loader_fractions.values()) <= stats.waited_fraction + 1e-9
    assert "(loader.unbatch " in str(stats) and "loader.map slow " in str(stats)


def test_timing_loader_side_stages_does_not_change_the_loaders_states(local_shards, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")

    def state_after(count: int) -> dict[str, Any]:
        ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast)
        loader = TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=list).unbatch().shuffle(8).batch(4)
        it = iter(loader)
        for _ in range(count):
            next(it)
        state = loader.state_dict()
        loader.close()
        return state

    timed = state_after(3)
    monkeypatch.setenv(STAGE_TIMES_ENV, "0")
    assert state_after(3) == timed


def test_a_torch_loader_with_loader_side_stages_resumes_exactly(local_shards) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")

    def loader() -> TorchLoader:
        ds = Dataset.from_source("tars", local_shards.local_paths, daemon=None).map(fast)
        return TorchLoader(ds, num_workers=2, batch_size=4, collate_fn=list).unbatch().shuffle(8).batch(4)

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    rest = list(it)
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    assert list(resumed) == rest
    resumed.close()
    assert len(head) + len(rest) == SAMPLES // 4
