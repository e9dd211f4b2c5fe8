"""A source kind carries its traits (`shardcache.sources.kinds`): a kind declared and registered in this
test module, under a name no code knows, is read, dealt, subset, shuffled and fingerprinted by what it
declares, never by its name."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardcache import ConfigError, Dataset, RuntimeContext
from shardcache.errors import UnsupportedOperation
from shardcache.sources import _NODES as NODES  # the registry, restored after each test
from shardcache.sources import SourceKind, SourceNode, Unit, register_kind
from shardcache.sources.deal.partition import ShardUnits
from shardcache.sources.kinds import _KINDS as TRAITS  # restored after each test
from shardcache.sources.kinds import kind_of

SAMPLES_PER_SHARD = 3


def _check_toy_options(options: dict[str, Any]) -> None:
    if not isinstance(options.get("label", ""), str):
        raise ConfigError(f"label={options['label']!r}: expected a string")


class ToySource(SourceNode):
    """Each shard URL `toy://<name>` holds SAMPLES_PER_SHARD samples, made in memory."""

    uses_daemon = False

    def units(self) -> ShardUnits:
        return ShardUnits(self.spec.shards)

    def read(self, unit: Unit, plan: str | None, start: int) -> Iterator[dict[str, Any]]:
        for i in range(start, SAMPLES_PER_SHARD):
            yield {"__key__": f"{unit.ref.url}#{i}", "label": self.spec.options.get("label", "")}


TOY = SourceKind(
    "toy",
    options=("label", "shuffle_mode"),
    check_options=_check_toy_options,
    data_suffix=None,
    unit_shuffle_modes=("shard_aware", "none"),
    shuffle_mode_code="UnsupportedToyShuffleMode",
    subset_level="shard",
    order_neutral=lambda name, value: name == "label",
)


@pytest.fixture
def toy_kind() -> Iterator[SourceKind]:
    traits, nodes = dict(TRAITS), dict(NODES)
    register_kind(TOY, ToySource)
    try:
        yield TOY
    finally:
        TRAITS.clear()
        TRAITS.update(traits)
        NODES.clear()
        NODES.update(nodes)


def toy(count: int = 8, **options: Any) -> Dataset:
    shards = [f"toy://shard{i:02d}" for i in range(count)]
    return Dataset.from_source("toy", shards=shards, daemon=None, **options)


def keys(dataset: Dataset, context: RuntimeContext) -> list[str]:
    return [sample["__key__"] for sample in dataset.iter_context(context)]


def test_a_registered_kind_is_read_and_dealt_among_the_ranks(toy_kind: SourceKind) -> None:
    dataset = toy()
    per_rank = [keys(dataset, RuntimeContext(rank=r, world_size=2, seed=3)) for r in range(2)]
    assert sorted(per_rank[0] + per_rank[1]) == sorted(
        f"toy://shard{i:02d}#{j}" for i in range(8) for j in range(3)
    )
    assert not set(per_rank[0]) & set(per_rank[1])


def test_its_own_options_are_checked_by_its_own_check(toy_kind: SourceKind) -> None:
    with pytest.raises(ConfigError, match="label=3"):
        toy(label=3)
    with pytest.raises(ConfigError, match="unknown argument columns="):
        toy(columns=["a"])


def test_its_shuffle_modes_are_the_ones_it_declares(toy_kind: SourceKind) -> None:
    in_order = keys(toy(shuffle_mode="none"), RuntimeContext(rank=0, world_size=1, seed=3))
    assert in_order == sorted(in_order)
    with pytest.raises(ConfigError) as refused:
        toy(shuffle_mode="global")
    assert refused.value.code == "UnsupportedToyShuffleMode"


def test_an_option_it_calls_order_neutral_stays_out_of_the_fingerprint(toy_kind: SourceKind) -> None:
    assert toy(label="a").fingerprint() == toy().fingerprint()
    assert toy(shuffle_mode="shard_aware").fingerprint() == toy().fingerprint()  # its default mode
    assert toy(shuffle_mode="none").fingerprint() != toy().fingerprint()


def test_a_shard_level_kind_is_split_into_whole_shards_when_split_is_called(toy_kind: SourceKind) -> None:
    first, second = toy().split([0.5, 0.5])
    assert len(first.source.shards) + len(second.source.shards) == 8
    assert not {s.url for s in first.source.shards} & {s.url for s in second.source.shards}


def test_a_kind_that_does_not_filter_rows_refuses_filter(toy_kind: SourceKind) -> None:
    assert not kind_of("toy").filters_rows
    with pytest.raises(UnsupportedOperation, match="only the lance source filters rows"):
        toy().filter("label = 'a'")
