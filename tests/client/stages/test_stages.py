"""Stages (seed README, Pipeline Semantics): map, select, shuffle, assemble, batch, unbatch, resume."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.pipelines import keys, make_tars
from shardcache import Dataset, RuntimeContext
from shardcache.errors import ConfigError, StateError


@pytest.fixture
def tars(tmp_path: Path) -> list[str]:
    return make_tars(tmp_path / "tars", count=4, samples=6)


def base(tars: list[str]) -> Dataset:
    return Dataset.from_source("tars", tars, daemon=None)


def add_len(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "length": len(sample["txt"])}


class Pairs:
    """An assembler that packs two samples into one and reports its context."""

    def __init__(self, context: RuntimeContext) -> None:
        self.context = context
        self.pending: list[str] = []

    def push(self, sample: dict[str, Any]) -> Iterator[tuple[str, ...]]:
        self.pending.append(sample["__key__"])
        if len(self.pending) == 2:
            out, self.pending = tuple(self.pending), []
            yield out

    def finish(self, *, drop_last: bool = False) -> Iterator[tuple[str, ...]]:
        if self.pending and not drop_last:
            yield tuple(self.pending)


def test_stages_return_new_datasets_and_leave_the_original_unchanged(tars: list[str]) -> None:
    ds = base(tars)
    mapped = ds.map(add_len)
    assert mapped is not ds
    assert ds.stages == ()
    assert [s.kind for s in mapped.shuffle(4).batch(2).unbatch().stages] == [
        "map",
        "shuffle",
        "batch",
        "unbatch",
    ]


def test_map_applies_the_function(tars: list[str]) -> None:
    assert all(s["length"] == len(s["txt"]) for s in base(tars).map(add_len))


def test_select_keeps_fields_and_metadata(tars: list[str]) -> None:
    sample = next(iter(base(tars).select(["txt"])))
    assert sorted(sample) == ["__index_in_shard__", "__key__", "__shard__", "txt"]


def test_select_of_a_missing_field_names_it(tars: list[str]) -> None:
    with pytest.raises(KeyError, match="no field 'nope'"):
        list(base(tars).select("nope"))


def test_shuffle_permutes_deterministically_per_seed_and_epoch(tars: list[str]) -> None:
    plain = keys(base(tars))
    shuffled = base(tars).shuffle(8)
    first = keys(shuffled)
    assert sorted(first) == sorted(plain) and first != plain
    shuffled.set_epoch(0)
    assert keys(shuffled) == first
    shuffled.set_epoch(1)
    assert keys(shuffled) != first


def test_shuffle_is_identical_for_tp_co_members(tars: list[str]) -> None:
    ds = base(tars).shuffle(5, initial=2)
    a = keys(ds.iter_context(RuntimeContext(rank=0, world_size=2, seed=3)))
    assert a == keys(ds.iter_context(RuntimeContext(rank=0, world_size=2, seed=3)))


def test_assemble_gets_the_resolved_context_and_finishes(tars: list[str]) -> None:
    seen: list[RuntimeContext] = []

    def factory(ctx: RuntimeContext) -> Pairs:
        seen.append(ctx)
        return Pairs(ctx)

    ctx = RuntimeContext(rank=1, world_size=2, seed=7)
    out = list(base(tars).assemble(factory).iter_context(ctx))
    assert seen == [ctx]
    assert [len(o) for o in out] == [2] * 6
    odd = list(base(tars[:1]).map(add_len).select("txt").assemble(Pairs).iter_context(None))
    assert len(odd) == 3
    assert len(list(base(make_tars(Path(tars[0]).parent / "odd", 1, 5)).assemble(Pairs, drop_last=True))) == 2


def test_batch_and_unbatch_round_trip(tars: list[str]) -> None:
    ds = base(tars)
    batches = list(ds.batch(5))
    assert [len(b) for b in batches] == [5, 5, 5, 5, 4]
    assert [len(b) for b in ds.batch(5, drop_last=True)] == [5] * 4
    assert keys(ds.batch(5).unbatch()) == keys(ds)
    assert list(ds.batch(5, collate_fn=len)) == [5, 5, 5, 5, 4]


def test_unbatch_splits_dicts_of_columns(tars: list[str]) -> None:
    def columns(batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
        return {"__key__": [s["__key__"] for s in batch]}

    assert keys(base(tars).batch(4, collate_fn=columns).unbatch()) == keys(base(tars))


def test_state_from_another_pipeline_is_refused(tars: list[str]) -> None:
    ds = base(tars).map(add_len)
    next(iter(ds))
    with pytest.raises(StateError, match="another source or stage list"):
        base(tars).load_state_dict(ds.state_dict())


def test_state_from_another_slot_layout_is_refused(tars: list[str]) -> None:
    ds = base(tars)
    next(iter(ds))
    other = base(tars)
    other.load_state_dict(ds.state_dict())
    with pytest.raises(StateError, match="slot 0 of 1"):
        iter(other.iter_context(RuntimeContext(rank=0, world_size=2)))


def test_state_carries_the_epoch(tars: list[str]) -> None:
    ds = base(tars).shuffle(4)
    ds.set_epoch(3)
    it = iter(ds)
    head = [next(it) for _ in range(5)]
    state = ds.state_dict()
    assert state["state"]["epoch"] == 3
    resumed = base(tars).shuffle(4)
    resumed.load_state_dict(state)
    ds.set_epoch(3)
    assert head + list(resumed) == list(ds)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda d: d.map(1), "fn="),
        (lambda d: d.select([]), "fields="),
        (lambda d: d.shuffle(0), "buffer_size="),
        (lambda d: d.shuffle(4, initial=-1), "initial="),
        (lambda d: d.batch(0), "batch_size="),
        (lambda d: d.batch(2, collate_fn=3), "collate_fn="),
        (lambda d: d.assemble(None), "factory="),
        (lambda d: d.set_epoch(-1), "epoch="),
    ],
)
def test_bad_stage_arguments_name_the_argument(tars: list[str], call: Any, name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        call(base(tars))


def first_two(items: list[Any]) -> list[Any]:
    return items[:2]


# mvp-dataset's test_stage_objects_are_picklable pickles `dataset.<stage>(...)._stages[-1].apply` and
# `loader._stages`, attributes of its internals; what it checks is that a pipeline with each stage pickles
# (DataLoader workers and spawn receive it so). Here: the public objects, round-tripped.
@pytest.mark.parametrize(
    "derive",
    [
        lambda ds: ds.map(add_len),
        lambda ds: ds.select(["txt"]),
        lambda ds: ds.shuffle(buffer_size=3),
        lambda ds: ds.batch(2, collate_fn=first_two),
        lambda ds: ds.batch(2).unbatch(),
        lambda ds: ds.assemble(Pairs),
    ],
    ids=["map", "select", "shuffle", "batch", "unbatch", "assemble"],
)
def test_a_dataset_with_each_stage_pickles_and_reads_the_same(tars: list[str], derive: Any) -> None:
    ds = derive(base(tars))
    assert list(pickle.loads(pickle.dumps(ds))) == list(ds)


def test_a_torch_loader_with_its_own_stages_pickles(tars: list[str]) -> None:
    pytest.importorskip("torch")
    from shardcache.loader.torch_loader import TorchLoader

    loader = TorchLoader(base(tars), num_workers=0, batch_size=2, collate_fn=first_two).unbatch().shuffle(3)
    pickle.loads(pickle.dumps(loader))
