"""A stage kind carries its own traits: code outside its module asks them, never its `kind` string.

Toy stages declared here, under names no module knows, prove it: what they declare is what the cache
boundary, the telemetry and the elastic resume do with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from shardcache.context import RuntimeContext
from shardcache.daemon_access.telemetry import items_are_batches
from shardcache.errors import ConfigError
from shardcache.node import Node, StatelessNode
from shardcache.resume.elastic import POSITION_STAGE_KINDS
from shardcache.snapshots.identity import frozen_identities, validate_pre_cache
from shardcache.stages import STAGE_SPECS, MapStage, StageTraits


class _Tagged(StatelessNode):
    def gen(self) -> Iterator[Any]:
        for sample in self.up.iterator():
            yield {**sample, "tag": True}


@dataclass(frozen=True)
class TagStage(StageTraits):
    """A toy one-to-one stage that may run before `.cache()`."""

    kind: ClassVar[str] = "tag"
    passes_position: ClassVar[bool] = True
    one_to_one: ClassVar[bool] = True
    keeps_count: ClassVar[bool] = True
    before_cache: ClassVar[bool] = True

    def node(self, up: Node, ctx: RuntimeContext) -> Node:
        return _Tagged(up)

    def describe(self) -> str:
        return "tag()"

    def cache_identity(self, frozen: str | None = None) -> tuple[Any, ...]:
        return ("tag",)


@dataclass(frozen=True)
class WindowStage(StageTraits):
    """A toy stage that declares nothing: the cautious defaults."""

    kind: ClassVar[str] = "window"


@dataclass(frozen=True)
class GroupStage(StageTraits):
    """A toy stage whose items are batches."""

    kind: ClassVar[str] = "group"
    batches: ClassVar[bool | None] = True


def test_a_stage_declared_cacheable_may_run_before_cache() -> None:
    validate_pre_cache([TagStage(), MapStage(str)])


def test_a_stage_that_declares_nothing_is_refused_before_cache_naming_its_kind() -> None:
    with pytest.raises(ConfigError, match="stage 'window' before .cache"):
        validate_pre_cache([WindowStage()])


def test_a_batching_stage_before_cache_is_refused_with_the_move_advice() -> None:
    refused = r"\.group\(\) before \.cache\(\) is not supported.*Move \.group\(\)"
    with pytest.raises(ConfigError, match=refused):
        validate_pre_cache([GroupStage()])


def test_telemetry_counts_samples_in_batches_after_a_batching_stage() -> None:
    assert items_are_batches([TagStage.batches, GroupStage.batches], batched_before=False)
    assert not items_are_batches([GroupStage.batches, TagStage.batches, False], batched_before=True)
    assert items_are_batches([TagStage.batches], batched_before=True)


def test_a_stage_without_a_user_callable_has_no_frozen_identity() -> None:
    assert frozen_identities([TagStage(), MapStage(lambda sample: sample)])[0] is None


def test_the_elastic_refusal_names_the_built_in_position_stages_in_order() -> None:
    assert POSITION_STAGE_KINDS == ("map", "select", "batch")
    assert all(issubclass(spec, StageTraits) for spec in STAGE_SPECS)
